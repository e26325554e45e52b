//! Reading the files a user names (configs, tokenizers, latency tables, checkpoints): each must be a
//! regular file, is read up to a size limit, and an error says what the path is instead — a FIFO,
//! a device, a directory, a symlink loop — so `/dev/zero` cannot exhaust memory and a FIFO cannot
//! block the program.
//!
//! Files are opened with `O_NONBLOCK` (opening a FIFO for reading would otherwise wait for a
//! writer) and checked with `fstat` on the opened descriptor, so what is read is what was
//! checked. Symlinks are followed (the Hugging Face cache is made of them); a loop is named.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::{Error, Result};

/// Largest JSON file read (`config.json`, `generation_config.json`,
/// `model.safetensors.index.json`, latency tables).
pub const MAX_JSON_BYTES: u64 = 64 << 20;

/// Largest `tokenizer.json` read (the largest public vocabularies take tens of MiB).
pub const MAX_TOKENIZER_BYTES: u64 = 1 << 30;

/// What `path` is, for messages: `a FIFO`, `a character device`, `a directory`, `a symlink
/// loop`, ... (`None`: a regular file, or nothing at all).
pub fn describe(path: &Path) -> Option<&'static str> {
    match std::fs::metadata(path) {
        Ok(m) => kind_of(&m),
        Err(e) if is_loop(&e) => Some("a symlink loop"),
        Err(_) => None,
    }
}

fn is_loop(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        e.raw_os_error() == Some(libc::ELOOP)
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

fn kind_of(m: &std::fs::Metadata) -> Option<&'static str> {
    let t = m.file_type();
    if t.is_file() {
        return None;
    }
    if t.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Some("a FIFO (named pipe)");
        }
        if t.is_char_device() {
            return Some("a character device");
        }
        if t.is_block_device() {
            return Some("a block device");
        }
        if t.is_socket() {
            return Some("a socket");
        }
    }
    Some("not a regular file")
}

/// Open `path` for reading, checked to be a regular file (never blocking on a FIFO); `what`
/// names it in errors (`tokenizer`, `config`).
pub fn open_regular(path: &Path, what: &str) -> Result<(File, u64)> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NONBLOCK);
    }
    let f = o.open(path).map_err(|e| {
        if is_loop(&e) {
            Error::file(path, format!("is a symlink loop, not a {what} file"))
        } else if e.kind() == std::io::ErrorKind::NotFound {
            Error::file(path, format!("no such {what} file"))
        } else {
            Error::file(path, e)
        }
    })?;
    let m = f.metadata().map_err(|e| Error::file(path, e))?;
    if let Some(k) = kind_of(&m) {
        return Err(Error::file(
            path,
            format!("is {k}, not a regular {what} file"),
        ));
    }
    Ok((f, m.len()))
}

/// The bytes of the regular file `path`, at most `limit` of them (a larger file is an error
/// naming both sizes).
pub fn read_limited(path: &Path, what: &str, limit: u64) -> Result<Vec<u8>> {
    let (f, len) = open_regular(path, what)?;
    let too_big = |n: u64| {
        Error::file(
            path,
            format!("is {n} bytes, more than the {limit}-byte limit for a {what} file"),
        )
    };
    if len > limit {
        return Err(too_big(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // The size may change under us (or be wrong, as for some pseudo-files): read one byte past
    // the limit at most.
    f.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::file(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// The text of the regular file `path`, at most `limit` bytes of UTF-8.
pub fn read_text(path: &Path, what: &str, limit: u64) -> Result<String> {
    String::from_utf8(read_limited(path, what, limit)?)
        .map_err(|e| Error::file(path, format!("is not UTF-8 text: {e}")))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_named_and_sizes_bounded() {
        let e = read_text(Path::new("/dev/zero"), "config", 1024)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/dev/zero") && e.contains("character device"),
            "{e}"
        );
        let e = read_text(Path::new("/"), "config", 1024)
            .unwrap_err()
            .to_string();
        assert!(e.contains("directory"), "{e}");
        let dir = std::env::temp_dir().join(format!("dllm-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.json");
        std::fs::write(&big, vec![b' '; 2048]).unwrap();
        let e = read_text(&big, "config", 1024).unwrap_err().to_string();
        assert!(
            e.contains("2048 bytes") && e.contains("1024-byte limit"),
            "{e}"
        );
        assert_eq!(read_text(&big, "config", 4096).unwrap().len(), 2048);
        let a = dir.join("loop-a");
        let _ = std::fs::remove_file(&a);
        std::os::unix::fs::symlink(&a, &a).unwrap();
        let e = read_text(&a, "config", 1024).unwrap_err().to_string();
        assert!(e.contains("symlink loop"), "{e}");
        assert_eq!(describe(&a), Some("a symlink loop"));
        // A FIFO with no writer: an error at once, not a wait for one.
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let e = read_text(&fifo, "tokenizer", 1024).unwrap_err().to_string();
        assert!(e.contains("FIFO") && e.contains("tokenizer"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
