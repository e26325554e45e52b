//! A minimal HTTP/1.1 client over `TcpStream` for loopback tests and the load benchmark
//! (`src/bin/server_bench.rs` includes this file): one request per connection, chunked bodies,
//! SSE `data:` payloads.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

/// A response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse(&self) -> Vec<String> {
        sse_data(&self.body)
    }
}

pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|block| {
            let d: Vec<&str> = block
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|l| l.strip_prefix(' ').unwrap_or(l))
                .collect();
            (!d.is_empty()).then(|| d.join("\n"))
        })
        .collect()
}

/// Connect with a generous read timeout (a hung server fails the test instead of hanging it).
pub fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).ok();
    s
}

pub fn request_head(method: &str, path: &str, addr: &str, len: usize) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {len}\r\nConnection: close\r\n\r\n"
    )
}

/// One request on its own connection (`Connection: close`), read to the end.
pub fn request(addr: &str, method: &str, path: &str, body: &[u8]) -> Response {
    request_within(addr, method, path, body, Duration::from_secs(120))
}

/// [`request`] with another read timeout (the benchmark's requests may queue for minutes).
pub fn request_within(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> Response {
    let mut s = connect(addr);
    s.set_read_timeout(Some(timeout)).ok();
    s.write_all(request_head(method, path, addr, body.len()).as_bytes())
        .expect("write head");
    // A server may answer (413) before reading a large body; ignore a reset while writing.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> Response {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Response {
        status,
        headers,
        body: String::from_utf8(body).expect("UTF-8 body"),
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size_hex = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size_hex.split(';').next().unwrap_or("").trim(), 16)
            .expect("chunk size");
        if size == 0 {
            break;
        }
        let start = eol + 2;
        out.extend_from_slice(&b[start..start + size]);
        b = &b[start + size + 2..];
    }
    out
}
