//! The HTTP layer's defences against web pages and idle sockets: JSON bodies only (415), `Host`
//! checked against the bound address (DNS rebinding), `Origin` refused unless allowed (CORS for
//! the allowed), `--api-key`, and connections bounded by `--header-timeout`, `--idle-timeout`
//! and `--max-connections`. The timeouts are made small through the flags and each test waits
//! for the server to close the connection (bounded, so a server that never closes fails the
//! test instead of hanging it); no test measures how fast.

use crate::common;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{parse_response, Response, Server, TOM, TOM_ANSWER};
use serde_json::json;

/// How long a test waits at most for the server to close a connection.
const BOUND: Duration = Duration::from_secs(60);

/// A short completion (8 positions).
fn body() -> String {
    json!({"prompt": TOM, "max_tokens": 8}).to_string()
}

/// One request with the given extra header lines (`Host` is the server's address unless they
/// name another, or `None` for no Host at all), on its own connection, read to the end.
fn send(
    addr: &str,
    method: &str,
    path: &str,
    host: Option<&str>,
    extra: &[&str],
    body: &str,
) -> Response {
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    if let Some(h) = host {
        head.push_str(&format!("Host: {h}\r\n"));
    }
    for line in extra {
        head.push_str(&format!("{line}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    let mut s = common::connect(addr);
    s.write_all(head.as_bytes()).expect("write");
    parse_response(&read_until_closed(&mut s))
}

/// A JSON POST from an ordinary client (no Origin).
fn post(s: &Server, path: &str, extra: &[&str], body: &str) -> Response {
    let mut lines = vec!["Content-Type: application/json"];
    lines.extend_from_slice(extra);
    send(&s.addr, "POST", path, Some(&s.addr), &lines, body)
}

/// Everything the server sends until it closes the connection (a reset counts as closed).
/// Fails if the connection is still open after [`BOUND`].
fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(BOUND)).expect("read timeout");
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return out,
            Err(e) => panic!(
                "the server kept the connection open ({e}) after sending {:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}

/// One response on a keep-alive connection (its body by Content-Length), leaving it open.
fn read_one_response(r: &mut BufReader<TcpStream>) -> Response {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut line = Vec::new();
        assert!(
            r.read_until(b'\n', &mut line).expect("read") > 0,
            "closed mid-head"
        );
        head.extend_from_slice(&line);
    }
    let resp = parse_response(&head);
    let len: usize = resp
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .expect("a content-length");
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).expect("body");
    head.extend_from_slice(&body);
    parse_response(&head)
}

#[test]
fn only_json_bodies_are_accepted() {
    let s = Server::start(&[]);
    // A "simple" cross-site request: a browser sends it from any page without asking.
    for (ct, path) in [
        ("text/plain", "/v1/completions"),
        ("text/plain;charset=UTF-8", "/v1/chat/completions"),
        ("application/x-www-form-urlencoded", "/v1/completions"),
        ("multipart/form-data; boundary=x", "/v1/completions"),
    ] {
        let r = send(
            &s.addr,
            "POST",
            path,
            Some(&s.addr),
            &[&format!("Content-Type: {ct}")],
            &body(),
        );
        assert_eq!(r.status, 415, "{ct}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["code"], "unsupported_media_type", "{e}");
        assert!(e["message"].as_str().unwrap().contains(ct), "{e}");
    }
    let r = send(
        &s.addr,
        "POST",
        "/v1/completions",
        Some(&s.addr),
        &[],
        &body(),
    );
    assert_eq!(r.status, 415, "{}", r.body);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no Content-Type"));
    for ct in [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
    ] {
        let r = send(
            &s.addr,
            "POST",
            "/v1/completions",
            Some(&s.addr),
            &[&format!("Content-Type: {ct}")],
            &body(),
        );
        assert_eq!(r.status, 200, "{ct}: {}", r.body);
    }
    assert_eq!(s.health()["requests_started"], 3);
}

#[test]
fn hosts_other_than_the_bound_address_are_refused() {
    let s = Server::start(&[]);
    let port = s.addr.rsplit(':').next().unwrap().to_string();
    // A DNS-rebinding page: its own name, pointed at 127.0.0.1.
    for host in [
        "evil.example".to_string(),
        format!("evil.example:{port}"),
        "localhost:1".into(),
        "10.1.2.3".into(),
    ] {
        for (method, path) in [
            ("POST", "/v1/completions"),
            ("GET", "/health"),
            ("GET", "/v1/models"),
            ("GET", "/"),
        ] {
            let r = send(
                &s.addr,
                method,
                path,
                Some(&host),
                &["Content-Type: application/json"],
                &body(),
            );
            assert_eq!(r.status, 403, "{host} {path}: {}", r.body);
            let e = &r.json()["error"];
            assert_eq!(e["code"], "host_not_allowed", "{e}");
            assert!(
                e["message"].as_str().unwrap().contains(host.as_str()),
                "{e}"
            );
        }
    }
    let r = send(&s.addr, "GET", "/health", None, &[], "");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Host"));
    // The loopback names, with or without the port.
    for host in [
        "localhost".to_string(),
        format!("localhost:{port}"),
        "127.0.0.1".into(),
        s.addr.clone(),
        "[::1]".into(),
        format!("[::1]:{port}"),
    ] {
        let r = send(
            &s.addr,
            "POST",
            "/v1/completions",
            Some(&host),
            &["Content-Type: application/json"],
            &body(),
        );
        assert_eq!(r.status, 200, "{host}: {}", r.body);
    }
}

#[test]
fn pages_of_other_origins_are_refused() {
    let s = Server::start(&[]);
    for origin in ["http://evil.example", "null", "http://localhost:3000"] {
        let r = post(
            &s,
            "/v1/completions",
            &[&format!("Origin: {origin}")],
            &body(),
        );
        assert_eq!(r.status, 403, "{origin}: {}", r.body);
        assert!(
            r.header("access-control-allow-origin").is_none(),
            "{:?}",
            r.headers
        );
        let e = &r.json()["error"];
        assert_eq!(e["code"], "origin_not_allowed", "{e}");
        assert!(e["message"].as_str().unwrap().contains(origin), "{e}");
        assert!(
            e["message"].as_str().unwrap().contains("--allow-origin"),
            "{e}"
        );
    }
    // The server's own page (browsers send Origin with every POST) and clients without Origin.
    let own = format!("Origin: http://{}", s.addr);
    for extra in [vec![own.as_str()], vec![]] {
        let r = post(&s, "/v1/completions", &extra, &body());
        assert_eq!(r.status, 200, "{extra:?}: {}", r.body);
        assert!(r.header("access-control-allow-origin").is_none());
        assert_eq!(
            r.json()["choices"][0]["text"]
                .as_str()
                .map(|t| TOM_ANSWER.starts_with(t)),
            Some(true)
        );
    }
}

#[test]
fn allowed_origins_get_cors_and_preflight_answers() {
    let s = Server::start(&[
        "--allow-origin",
        "http://app.example:3000",
        "--allow-origin",
        "https://ui.example/",
    ]);
    for origin in ["http://app.example:3000", "https://ui.example"] {
        let preflight = send(
            &s.addr,
            "OPTIONS",
            "/v1/chat/completions",
            Some(&s.addr),
            &[
                &format!("Origin: {origin}"),
                "Access-Control-Request-Method: POST",
                "Access-Control-Request-Headers: authorization, content-type",
            ],
            "",
        );
        assert!((200..300).contains(&preflight.status), "{}", preflight.body);
        assert_eq!(
            preflight.header("access-control-allow-origin"),
            Some(origin)
        );
        assert!(preflight
            .header("access-control-allow-methods")
            .is_some_and(|m| m.contains("POST")));
        let allowed = preflight
            .header("access-control-allow-headers")
            .unwrap_or("")
            .to_ascii_lowercase();
        assert!(
            allowed.contains("content-type") && allowed.contains("authorization"),
            "{allowed}"
        );
        let r = post(
            &s,
            "/v1/completions",
            &[&format!("Origin: {origin}")],
            &body(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("access-control-allow-origin"), Some(origin));
        assert!(r.header("vary").is_some_and(|v| v.contains("Origin")));
    }
    // A preflight from a page not named: refused, no CORS headers.
    let r = send(
        &s.addr,
        "OPTIONS",
        "/v1/completions",
        Some(&s.addr),
        &[
            "Origin: http://evil.example",
            "Access-Control-Request-Method: POST",
        ],
        "",
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.header("access-control-allow-origin").is_none());
}

#[test]
fn an_api_key_is_required_when_set() {
    let s = Server::start(&["--api-key", "sk-local-test"]);
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer sk-local-tes"),
        Some("Basic sk-local-test"),
    ] {
        let line = auth.map(|a| format!("Authorization: {a}"));
        let extra: Vec<&str> = line.iter().map(String::as_str).collect();
        let r = post(&s, "/v1/completions", &extra, &body());
        assert_eq!(r.status, 401, "{auth:?}: {}", r.body);
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        let e = &r.json()["error"];
        assert_eq!(e["code"], "invalid_api_key", "{e}");
        assert!(e["message"].as_str().unwrap().contains("--api-key"), "{e}");
        let r = send(&s.addr, "GET", "/v1/models", Some(&s.addr), &extra, "");
        assert_eq!(r.status, 401, "{}", r.body);
    }
    let key = "Authorization: Bearer sk-local-test";
    let r = post(&s, "/v1/completions", &[key], &body());
    assert_eq!(r.status, 200, "{}", r.body);
    let r = send(&s.addr, "GET", "/v1/models", Some(&s.addr), &[key], "");
    assert_eq!(r.status, 200, "{}", r.body);
    // Health checks and the static page stay open.
    assert_eq!(s.health()["requests_completed"], 1);
    assert_eq!(s.get("/").status, 200);
}

#[test]
fn a_non_loopback_host_needs_an_api_key() {
    // Refused before the model loads or anything binds.
    let mut child = Command::new(env!("CARGO_BIN_EXE_llada-server"))
        .args(["--host", "0.0.0.0", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start llada-server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("stdout");
    if !line.is_empty() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the server started on a non-loopback address without --api-key: {line}");
    }
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--api-key") && err.contains("0.0.0.0"),
        "{err}"
    );
}

#[test]
fn a_connection_that_never_sends_a_byte_is_closed() {
    let s = Server::start(&["--header-timeout", "0.2", "--idle-timeout", "3600"]);
    let mut c = common::connect(&s.addr);
    assert_eq!(read_until_closed(&mut c), b"");
    // The server is still there.
    assert_eq!(s.health()["status"], "ok");
}

#[test]
fn a_half_sent_head_is_closed() {
    let s = Server::start(&["--header-timeout", "0.2", "--idle-timeout", "3600"]);
    let mut c = common::connect(&s.addr);
    c.write_all(
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Ty",
            s.addr
        )
        .as_bytes(),
    )
    .unwrap();
    let got = read_until_closed(&mut c);
    assert!(
        !got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(s.health()["requests_started"], 0);
}

#[test]
fn a_half_sent_body_gets_408_and_is_closed() {
    let s = Server::start(&["--header-timeout", "0.2", "--idle-timeout", "3600"]);
    let mut c = common::connect(&s.addr);
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"prompt\": ",
        s.addr
    );
    c.write_all(head.as_bytes()).unwrap();
    let r = parse_response(&read_until_closed(&mut c));
    assert_eq!(r.status, 408, "{}", r.body);
    assert!(r.body.contains("--header-timeout"), "{}", r.body);
}

#[test]
fn an_idle_keep_alive_connection_is_closed() {
    let s = Server::start(&["--idle-timeout", "0.2", "--header-timeout", "3600"]);
    let c = common::connect(&s.addr);
    let mut w = c.try_clone().unwrap();
    let mut r = BufReader::new(c);
    w.write_all(format!("GET /health HTTP/1.1\r\nHost: {}\r\n\r\n", s.addr).as_bytes())
        .unwrap();
    let first = read_one_response(&mut r);
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(read_until_closed(r.get_mut()), b"");
}

#[test]
fn streams_and_long_requests_outlive_the_idle_timeout() {
    // 200 one-step positions with no EOS (every step runs): longer than a 50 ms idle timeout on
    // any machine, yet the response is whole: a request being answered is not idle.
    let s = Server::start(&["--idle-timeout", "0.05", "--logits-eos-inf"]);
    let stream = json!({"prompt": TOM, "max_tokens": 200, "strategy": "vanilla", "stream": true,
                        "stream_options": {"canvas": true}});
    let r = post(&s, "/v1/completions", &[], &stream.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    let data = r.sse();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let canvases = data.iter().filter(|d| d.contains("\"canvas\"")).count();
    assert_eq!(canvases, 200, "one canvas per step");
    let plain = json!({"prompt": TOM, "max_tokens": 200, "strategy": "vanilla"});
    let r = post(&s, "/v1/completions", &[], &plain.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");
}

#[test]
fn connections_beyond_the_cap_are_refused_without_touching_the_others() {
    let s = Server::start(&["--max-connections", "2", "--header-timeout", "3600"]);
    // Two connections hold both slots (accepted in order, before the third).
    let mut a = common::connect(&s.addr);
    let mut b = common::connect(&s.addr);
    let mut c = common::connect(&s.addr);
    let refused = parse_response(&read_until_closed(&mut c));
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.json()["error"]["code"], "too_many_connections");
    assert!(
        refused.body.contains("--max-connections"),
        "{}",
        refused.body
    );
    // The two held connections are served as usual; each frees its slot as it closes.
    for held in [&mut a, &mut b] {
        let req = format!(
            "GET /health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            s.addr
        );
        held.write_all(req.as_bytes()).unwrap();
        let r = parse_response(&read_until_closed(held));
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let r = post(&s, "/v1/completions", &[], &body());
    assert_eq!(r.status, 200, "{}", r.body);
}
