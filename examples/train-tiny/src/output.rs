//! Where a run writes, and how, so that nothing of a model or of a run is ever lost or mixed.
//!
//! `--out X` is one directory: the model (`config.json`, `model.safetensors`,
//! `generation_config.json`, `tokenizer.json`), `train_args.json`, the run's `training_log.jsonl`
//! and its resumable `checkpoint/` (`model.safetensors`, `optimizer.safetensors`, `state.json`,
//! `config.json`). The rules:
//!
//! - **A directory is replaced as one unit.** Every save (a checkpoint, the final model) is written
//!   in full into a fresh temporary directory beside its destination, every file and the
//!   directory fsynced, and then swapped with the destination by one `renameat2(RENAME_EXCHANGE)`
//!   (one `rename` when there is no destination yet), after which the parent is fsynced and the
//!   old contents are deleted. A reader, or a run killed at any instant, sees the old directory or
//!   the new one, never a mix: no stale `model.safetensors.index.json` or shard survives next to
//!   new weights, and a checkpoint's weights, optimizer moments and step always belong together.
//!   (On a file system without `RENAME_EXCHANGE`, the old directory is first renamed aside: a
//!   crash in between leaves the destination absent, never mixed.)
//! - **`--overwrite` keeps the old run until the new model exists.** When `X` already holds a
//!   model or a run, a new run trains in the sibling `X.next/` (its log and checkpoints), and `X`
//!   is replaced only when training has ended, with the new model, log and checkpoint. An
//!   interrupted `--overwrite` run is continued by `--resume`, which prefers `X.next/`.
//! - **Temporary names carry the writer's pid** (`.X.partial-<pid>`, `checkpoint.partial-<pid>`,
//!   `training_log.jsonl.partial-<pid>`). SIGINT and SIGTERM stop training at the next step
//!   boundary and save a checkpoint (see `main`); an error removes what it staged; a run that
//!   starts removes what dead processes left behind.
//! - **Outputs never follow a symlink or open a FIFO.** Files are created only inside fresh
//!   temporary directories (`O_EXCL`), and the one file opened in place — the log of a resumed
//!   run — must be a regular file (`O_NOFOLLOW`); `--out` itself may not be a symlink.
//! - **Consistent modes.** Every file gets the mode a newly created file gets under the process's
//!   umask (the safetensors writer would otherwise leave 0600 beside 0644).
//!
//! The environment variable `TRAIN_TINY_TEST_ABORT=<point>` aborts the process (as a SIGKILL
//! would, nothing cleaned up) at a named point of a save: `checkpoint-staged`, `model-staged`
//! (everything written and synced, just before the swap) or `model-swapped` (swapped, the old
//! directory not yet deleted). The tests use it; it has no other effect.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

/// The files that make a loadable model (what `--overwrite` guards).
pub const MODEL_FILES: [&str; 4] = [
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "generation_config.json",
];

/// The log of a run.
pub const LOG: &str = "training_log.jsonl";
/// The checkpoint of a run.
pub const CHECKPOINT: &str = "checkpoint";

/// Abort here if the tests asked for it (see the module docs).
pub fn test_abort_point(point: &str) {
    if std::env::var("TRAIN_TINY_TEST_ABORT").is_ok_and(|v| v == point) {
        eprintln!("TRAIN_TINY_TEST_ABORT: aborting at {point}");
        std::process::abort();
    }
}

/// The mode of a newly created file under the process's umask (read once, before any thread
/// starts: `umask` can only be read by setting it).
pub fn init_file_mode() {
    #[cfg(unix)]
    {
        // SAFETY: umask only swaps the process's file-creation mask; it is restored at once.
        let m = unsafe {
            let m = libc::umask(0o022);
            libc::umask(m);
            m
        };
        let _ = FILE_MODE.set(0o666 & !(m as u32));
    }
}

static FILE_MODE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

fn set_mode(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = *FILE_MODE.get().unwrap_or(&0o644);
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("setting the mode of {}", path.display()))?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))
}

/// What kind of thing `path` is, for messages (`None`: it does not exist).
fn kind(path: &Path) -> Option<&'static str> {
    let m = std::fs::symlink_metadata(path).ok()?;
    let t = m.file_type();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Some("a FIFO");
        }
        if t.is_char_device() || t.is_block_device() {
            return Some("a device");
        }
        if t.is_socket() {
            return Some("a socket");
        }
    }
    Some(if t.is_symlink() {
        "a symlink"
    } else if t.is_dir() {
        "a directory"
    } else {
        "a regular file"
    })
}

fn exists(path: &Path) -> bool {
    kind(path).is_some()
}

/// The paths of one `--out`.
#[derive(Debug, Clone)]
pub struct OutDir {
    /// The model directory, `X`.
    pub out: PathBuf,
    parent: PathBuf,
    name: OsString,
}

impl OutDir {
    /// `--out`, checked: not a symlink, a directory if it exists, in a writable parent.
    pub fn new(out: &Path) -> Result<Self> {
        match kind(out) {
            None | Some("a directory") => {}
            Some("a symlink") => bail!(
                "--out {}: is a symlink; train-tiny replaces its output directory as a whole \
                 and never follows symlinks: pass the directory itself",
                out.display()
            ),
            Some(k) => bail!(
                "--out {}: exists and is {k}, not a directory",
                out.display()
            ),
        }
        let name = out
            .file_name()
            .filter(|n| *n != "." && *n != "..")
            .map(|n| n.to_os_string())
            .ok_or_else(|| {
                anyhow!(
                    "--out {}: name the directory itself (e.g. runs/tiny), not `.`, `..` or `/`",
                    out.display()
                )
            })?;
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if kind(&parent).is_some_and(|k| k != "a directory") && !parent.is_dir() {
            bail!(
                "--out {}: its parent {} is not a directory",
                out.display(),
                parent.display()
            );
        }
        Ok(Self {
            out: out.to_path_buf(),
            parent,
            name,
        })
    }

    fn sibling(&self, suffix: &str, hidden: bool) -> PathBuf {
        let mut n = OsString::from(if hidden { "." } else { "" });
        n.push(&self.name);
        n.push(suffix);
        self.parent.join(n)
    }

    /// `X.next`: where an `--overwrite` run trains until its model replaces `X`.
    pub fn next(&self) -> PathBuf {
        self.sibling(".next", false)
    }

    /// A temporary directory of this process beside `X`.
    fn partial(&self) -> PathBuf {
        self.sibling(&format!(".partial-{}", std::process::id()), true)
    }

    /// The entries of `X` that make it hold a model or a run.
    fn run_files(dir: &Path) -> Vec<String> {
        let mut found: Vec<String> = MODEL_FILES
            .iter()
            .chain(&[LOG, CHECKPOINT])
            .filter(|f| exists(&dir.join(f)))
            .map(|f| f.to_string())
            .collect();
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with("model-") && n.ends_with(".safetensors") {
                    found.push(n);
                }
            }
        }
        found
    }

    /// Decide where this run trains (see the module docs); nothing is written.
    pub fn plan(&self, overwrite: bool, resume: bool) -> Result<RunDir> {
        let next = self.next();
        let here = Self::run_files(&self.out);
        let next_state = next.join(CHECKPOINT).join("state.json");
        if resume {
            let dir = if exists(&next_state) {
                next
            } else {
                self.out.clone()
            };
            let state = dir.join(CHECKPOINT).join("state.json");
            if !state.is_file() {
                bail!(
                    "--resume: {} has no training state to resume from",
                    state.display()
                );
            }
            return Ok(RunDir { dir, fresh: false });
        }
        let pending = exists(&next);
        if (here.is_empty() && !pending) || overwrite {
            let dir = if here.is_empty() && !pending {
                self.out.clone()
            } else {
                next
            };
            return Ok(RunDir { dir, fresh: true });
        }
        let what = if here.is_empty() {
            format!("{} holds an interrupted --overwrite run", next.display())
        } else if here.iter().any(|f| MODEL_FILES.contains(&f.as_str())) {
            format!("already holds a model ({})", here.join(", "))
        } else {
            format!("already holds a training run ({})", here.join(", "))
        };
        bail!(
            "--out {}: {what}: pass --overwrite to replace it, or --resume to continue its training",
            self.out.display()
        )
    }

    /// Check that the parent accepts the temporary directory of the final save (before training
    /// starts, so that a read-only location fails now, not hours later).
    pub fn probe_parent(&self) -> Result<()> {
        std::fs::create_dir_all(&self.parent)
            .with_context(|| format!("creating {}", self.parent.display()))?;
        let p = self.partial();
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).with_context(|| {
            format!(
                "--out {}: cannot create the temporary directory {} beside it",
                self.out.display(),
                p.display()
            )
        })?;
        std::fs::remove_dir(&p).with_context(|| format!("removing {}", p.display()))
    }

    /// Remove temporary files and directories left by processes that no longer run, in `X`'s
    /// parent (`.X.partial-<pid>`), `X`, `X.next` and their checkpoints (`*.partial-<pid>`).
    /// Returns what was removed.
    pub fn remove_stale(&self) -> Vec<PathBuf> {
        let mut removed = Vec::new();
        let mut hidden = OsString::from(".");
        hidden.push(&self.name);
        hidden.push(".partial-");
        let hidden = hidden.to_string_lossy().into_owned();
        let next = self.next();
        let scans: [(&Path, Option<&str>); 5] = [
            (&self.parent, Some(hidden.as_str())),
            (&self.out, None),
            (&self.out.join(CHECKPOINT), None),
            (&next, None),
            (&next.join(CHECKPOINT), None),
        ];
        for (dir, prefix) in scans {
            // Never into a symlinked directory.
            if kind(dir) != Some("a directory") {
                continue;
            }
            let Ok(rd) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if prefix.is_some_and(|p| !n.starts_with(p)) {
                    continue;
                }
                let Some(pid) = partial_pid(&n) else {
                    continue;
                };
                if pid == std::process::id() || pid_alive(pid) {
                    continue;
                }
                let p = e.path();
                let gone = if kind(&p) == Some("a directory") {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
                if gone.is_ok() {
                    removed.push(p);
                }
            }
        }
        removed
    }

    /// Replace `X` with the finished run: the model files `write` stages, `train_args.json`
    /// among them, plus the run's log and checkpoint from `run` and the `*.md` files of the old
    /// `X` (its model card), as one unit. Afterwards `run`'s directory is gone if it was `X.next`.
    pub fn install(&self, run: &RunDir, write: impl FnOnce(&Staging) -> Result<()>) -> Result<()> {
        let s = Staging::create(self.partial())?;
        write(&s)?;
        if exists(&run.dir.join(LOG)) {
            s.link(&run.dir.join(LOG), LOG)?;
        }
        let ck = run.dir.join(CHECKPOINT);
        if kind(&ck) == Some("a directory") {
            let dst = s.path.join(CHECKPOINT);
            std::fs::create_dir(&dst).with_context(|| format!("creating {}", dst.display()))?;
            for e in std::fs::read_dir(&ck).with_context(|| format!("reading {}", ck.display()))? {
                let e = e?;
                let n = e.file_name();
                if e.file_type()?.is_file() && partial_pid(&n.to_string_lossy()).is_none() {
                    link_or_copy(&e.path(), &dst.join(&n))?;
                }
            }
            sync_dir(&dst)?;
        }
        // A model card written by hand stays with the model.
        if kind(&self.out) == Some("a directory") {
            for e in std::fs::read_dir(&self.out)
                .with_context(|| format!("reading {}", self.out.display()))?
            {
                let e = e?;
                let n = e.file_name();
                if e.file_type()?.is_file()
                    && n.to_string_lossy().ends_with(".md")
                    && !exists(&s.path.join(&n))
                {
                    link_or_copy(&e.path(), &s.path.join(&n))?;
                }
            }
        }
        s.install(&self.out, "model")?;
        if run.dir != self.out {
            std::fs::remove_dir_all(&run.dir)
                .with_context(|| format!("removing {}", run.dir.display()))?;
            sync_dir(&self.parent)?;
        }
        Ok(())
    }
}

/// Where a run keeps its log and checkpoint while it trains: `X`, or `X.next`.
#[derive(Debug, Clone)]
pub struct RunDir {
    /// The directory.
    pub dir: PathBuf,
    /// A new run (the directory holds no run yet, or is replaced: `X.next` is cleared).
    pub fresh: bool,
}

impl RunDir {
    /// Create the directory (a fresh `X.next` starts empty).
    pub fn create(&self, out: &OutDir) -> Result<()> {
        if self.fresh && self.dir == out.next() && exists(&self.dir) {
            std::fs::remove_dir_all(&self.dir)
                .with_context(|| format!("clearing {}", self.dir.display()))?;
        }
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))
    }

    /// The checkpoint directory.
    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join(CHECKPOINT)
    }

    /// Save a checkpoint as one unit (the files `write` stages).
    pub fn save_checkpoint(&self, write: impl FnOnce(&Staging) -> Result<()>) -> Result<()> {
        let mut name = OsString::from(CHECKPOINT);
        name.push(format!(".partial-{}", std::process::id()));
        let s = Staging::create(self.dir.join(name))?;
        write(&s)?;
        s.install(&self.checkpoint(), "checkpoint")
    }

    /// Open the log for appending: a fresh run creates it (never over an existing entry); a
    /// resumed run keeps the lines up to `step` (rewritten under a temporary name and renamed)
    /// and appends to a regular file only.
    pub fn open_log(&self, resume_step: Option<usize>) -> Result<File> {
        let path = self.dir.join(LOG);
        if let Some(step) = resume_step {
            if exists(&path) {
                let text = read_regular(&path)?;
                let kept: String = text
                    .lines()
                    .filter(|l| {
                        serde_json::from_str::<serde_json::Value>(l)
                            .ok()
                            .and_then(|v| v["step"].as_u64())
                            .is_some_and(|s| s as usize <= step)
                    })
                    .map(|l| format!("{l}\n"))
                    .collect();
                let mut tmp = path.clone().into_os_string();
                tmp.push(format!(".partial-{}", std::process::id()));
                let tmp = PathBuf::from(tmp);
                write_new(&tmp, kept.as_bytes())?;
                std::fs::rename(&tmp, &path)
                    .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
                sync_dir(&self.dir)?;
            }
            let mut o = std::fs::OpenOptions::new();
            o.append(true).create(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                o.custom_flags(libc::O_NOFOLLOW);
            }
            return o
                .open(&path)
                .with_context(|| format!("opening {}", path.display()));
        }
        let f = std::fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        set_mode(&path)?;
        Ok(f)
    }
}

/// A regular file's text: a symlink, FIFO, device or directory is an error naming it (opened
/// with `O_NOFOLLOW | O_NONBLOCK`, so neither is followed or waited on).
pub fn read_regular(path: &Path) -> Result<String> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let f = o.open(path).map_err(|e| match kind(path) {
        Some(k) if k != "a regular file" => {
            anyhow!("{}: is {k}, not a regular file", path.display())
        }
        _ => anyhow!("{}: {e}", path.display()),
    })?;
    let m = f.metadata()?;
    if !m.is_file() {
        bail!(
            "{}: is {}, not a regular file",
            path.display(),
            kind(path).unwrap_or("not a regular file")
        );
    }
    let mut s = String::new();
    std::io::Read::read_to_string(&mut std::io::BufReader::new(f), &mut s)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(s)
}

/// Create `path` (never over an existing entry) with `bytes`, synced, with the umask's mode.
fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    set_mode(path)
}

fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        File::open(to).and_then(|f| f.sync_all())?;
    }
    Ok(())
}

/// `<name>.partial-<pid>`'s pid.
fn partial_pid(name: &str) -> Option<u32> {
    let (_, pid) = name.rsplit_once(".partial-")?;
    pid.parse().ok()
}

fn pid_alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(p) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let r = unsafe { libc::kill(p, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// A temporary directory being filled; dropped before [`Staging::install`], it is removed.
pub struct Staging {
    path: PathBuf,
    installed: std::cell::Cell<bool>,
}

impl Staging {
    fn create(path: PathBuf) -> Result<Self> {
        if exists(&path) {
            // Our own pid's leftover (pid reuse): nothing of this process.
            let _ = std::fs::remove_dir_all(&path);
        }
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self {
            path,
            installed: std::cell::Cell::new(false),
        })
    }

    /// Stage `bytes` as `name`.
    pub fn bytes(&self, name: &str, bytes: &[u8]) -> Result<()> {
        write_new(&self.path.join(name), bytes)
    }

    /// Stage `v` as pretty JSON.
    pub fn json(&self, name: &str, v: &impl serde::Serialize) -> Result<()> {
        self.bytes(name, serde_json::to_string_pretty(v)?.as_bytes())
    }

    /// Stage the file `write` writes (given its path, which does not exist yet) as `name`.
    pub fn with(&self, name: &str, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
        let p = self.path.join(name);
        write(&p).with_context(|| format!("writing {}", p.display()))?;
        match kind(&p) {
            Some("a regular file") => {}
            k => bail!(
                "{}: the writer left {}",
                p.display(),
                k.unwrap_or("nothing")
            ),
        }
        File::open(&p)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("syncing {}", p.display()))?;
        set_mode(&p)
    }

    fn link(&self, from: &Path, name: &str) -> Result<()> {
        match kind(from) {
            Some("a regular file") => link_or_copy(from, &self.path.join(name)),
            Some(k) => bail!("{}: is {k}, not a regular file", from.display()),
            None => Ok(()),
        }
    }

    /// Swap the staged directory into `dest` and delete what `dest` held.
    fn install(self, dest: &Path, what: &str) -> Result<()> {
        sync_dir(&self.path)?;
        test_abort_point(&format!("{what}-staged"));
        let parent = dest.parent().unwrap_or(Path::new("."));
        if exists(dest) {
            match exchange(&self.path, dest) {
                Ok(()) => {}
                Err(e)
                    if e.raw_os_error() == Some(libc::EINVAL)
                        || e.raw_os_error() == Some(libc::ENOSYS) =>
                {
                    // No RENAME_EXCHANGE here: the old directory goes aside first (a crash in
                    // between leaves `dest` absent, never mixed).
                    let mut aside = self.path.clone().into_os_string();
                    aside.push(".old");
                    std::fs::rename(dest, &aside)
                        .with_context(|| format!("renaming {} aside", dest.display()))?;
                    std::fs::rename(&self.path, dest).with_context(|| {
                        format!("renaming {} to {}", self.path.display(), dest.display())
                    })?;
                    std::fs::rename(&aside, &self.path)?;
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("swapping {} into {}", self.path.display(), dest.display())
                    })
                }
            }
        } else {
            std::fs::rename(&self.path, dest).with_context(|| {
                format!("renaming {} to {}", self.path.display(), dest.display())
            })?;
        }
        self.installed.set(true);
        sync_dir(parent)?;
        test_abort_point(&format!("{what}-swapped"));
        // The old contents, now under the temporary name.
        if exists(&self.path) {
            std::fs::remove_dir_all(&self.path)
                .with_context(|| format!("removing {}", self.path.display()))?;
            sync_dir(parent)?;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.installed.get() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Atomically exchange two paths (`renameat2(RENAME_EXCHANGE)`).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let ca = CString::new(a.as_os_str().as_bytes())?;
        let cb = CString::new(b.as_os_str().as_bytes())?;
        // SAFETY: two NUL-terminated paths relative to the working directory.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                ca.as_ptr(),
                libc::AT_FDCWD,
                cb.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (a, b);
        Err(std::io::Error::from_raw_os_error(libc::ENOSYS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_names_carry_the_pid() {
        assert_eq!(partial_pid("model.safetensors.partial-123"), Some(123));
        assert_eq!(partial_pid(".tiny.partial-7"), Some(7));
        assert_eq!(partial_pid("checkpoint"), None);
        assert_eq!(partial_pid("x.partial-abc"), None);
        assert!(pid_alive(std::process::id()));
    }
}
