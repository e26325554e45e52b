//! Shared by the server's tests: start `llada-server` on 127.0.0.1 with an ephemeral port, and a
//! minimal HTTP/1.1 client over `TcpStream` (loopback only).

#![allow(dead_code)]

mod http;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

pub use http::*;
use serde_json::Value;

/// The embedded model's worked example (what `generate` prints for it).
pub const TOM: &str = "Tom has 23 apples. He buys 5 more. How many apples does Tom have now?";
pub const TOM_ANSWER: &str = "23 + 5 = 28. Answer: 28";

/// A shipped model's directory (`models/<name>` at the workspace root).
pub fn model_dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name)
}

/// A running server, killed when dropped.
pub struct Server {
    child: Child,
    pub addr: String,
}

impl Server {
    /// `llada-server --port 0 <args>`; waits for its "listening on" line.
    pub fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_llada-server"))
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start llada-server");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("read the address line");
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Server { child, addr }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size of the server, KiB.
    pub fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("status");
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    pub fn post(&self, path: &str, body: &str) -> Response {
        request(&self.addr, "POST", path, body.as_bytes())
    }

    pub fn get(&self, path: &str) -> Response {
        request(&self.addr, "GET", path, b"")
    }

    pub fn health(&self) -> Value {
        let r = self.get("/health");
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether this run must have every tool (CI): missing tools fail instead of skipping.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Skip (locally) or fail (in CI) for a missing tool.
pub fn missing_tool(what: &str, install: &str) {
    if in_ci() {
        panic!("{what} is missing and CI=true: run .ci/install-test-deps ({install})");
    }
    eprintln!("SKIPPED: {what} is missing ({install}; .ci/install-test-deps installs it)");
}
