//! Who may talk to the server, checked on every request before any route runs:
//!
//! - `Host` must name the address the connection arrived at (loopback: `localhost`, `127.0.0.1`,
//!   `[::1]`; else that address), with or without the port: a page on another name that a DNS
//!   rebinding points at this machine is refused, so it cannot read the answers.
//! - `Origin`, when a browser sends one, must be this server's own (its page at `/`) or one that
//!   `--allow-origin` names; only those get CORS headers and preflight (`OPTIONS`) answers.
//!   Requests without `Origin` (curl, the SDKs) pass.
//! - With `--api-key`, `Authorization: Bearer <key>` on everything but `GET /health` and the
//!   page at `/` (static, no data).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use anyhow::{bail, Result};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The local address a request's connection arrived at (inserted by `conn` into every request).
#[derive(Debug, Clone, Copy)]
pub struct LocalAddr(pub SocketAddr);

/// The access policy of the server's flags.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// `--allow-origin`, normalized (lowercase, no trailing `/`).
    pub allow_origins: Vec<String>,
    /// `--api-key`.
    pub api_key: Option<String>,
}

impl Access {
    /// Check the flags: each origin `scheme://host[:port]` (or `null`), the key printable ASCII.
    pub fn new(allow_origins: &[String], api_key: Option<String>) -> Result<Self> {
        let mut origins = Vec::new();
        for o in allow_origins {
            let n = o.trim_end_matches('/').to_ascii_lowercase();
            let ok = n == "null"
                || n.split_once("://").is_some_and(|(scheme, rest)| {
                    !scheme.is_empty()
                        && scheme
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
                        && !rest.is_empty()
                        && !rest.contains(['/', '?', '#', '*', ' ', '@'])
                });
            if !ok {
                bail!(
                    "--allow-origin `{o}`: expected an origin, scheme://host[:port] \
                     (e.g. http://localhost:3000), or null; name each origin (no wildcard)"
                );
            }
            origins.push(n);
        }
        if let Some(k) = &api_key {
            if k.is_empty() || !k.bytes().all(|b| b.is_ascii_graphic()) {
                bail!("--api-key must be non-empty printable ASCII without spaces");
            }
        }
        Ok(Self {
            allow_origins: origins,
            api_key,
        })
    }
}

/// Whether `--host` names a loopback address (`localhost`, `127.x.x.x`, `::1`).
pub fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost") || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether a `Host` value names `local`, the address the connection arrived at: that address
/// (IPv6 in brackets), or on loopback also `localhost`, `127.0.0.1` and `[::1]`; a port, when
/// given, must be `local`'s.
pub fn host_allowed(host: &str, local: SocketAddr) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        // `[::1]` alone has colons but no port.
        Some((n, p)) if !p.contains(']') => (n, Some(p)),
        _ => (host, None),
    };
    if port.is_some_and(|p| p.parse::<u16>().ok() != Some(local.port())) {
        return false;
    }
    let ip: Option<IpAddr> = match name.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .and_then(|a| a.parse::<Ipv6Addr>().ok())
            .map(IpAddr::V6),
        None => name.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
    };
    let local_ip = local.ip().to_canonical();
    let loopback_name = name.eq_ignore_ascii_case("localhost")
        || ip == Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
        || ip == Some(IpAddr::V6(Ipv6Addr::LOCALHOST));
    ip == Some(local_ip) || (local_ip.is_loopback() && loopback_name)
}

fn forbidden(message: String, code: &'static str) -> Response {
    ApiError::request(message)
        .status(StatusCode::FORBIDDEN)
        .with_code(code)
        .into_response()
}

/// The middleware: Host, then Origin (answering preflights), then the API key; CORS headers on
/// every answer to an allowed cross-origin request.
pub async fn check(State(access): State<Arc<Access>>, req: Request, next: Next) -> Response {
    let Some(LocalAddr(local)) = req.extensions().get::<LocalAddr>().copied() else {
        return ApiError::server("the request carries no connection address").into_response();
    };
    let headers = req.headers();
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return ApiError::request("the request has no Host header (or one that is not text)")
            .with_code("missing_host")
            .into_response();
    };
    // An absolute-form target (`POST http://name/...`) names the host too.
    let target = req.uri().authority().map(|a| a.as_str());
    if let Some(bad) = [Some(host), target]
        .into_iter()
        .flatten()
        .find(|h| !host_allowed(h, local))
    {
        return forbidden(
            format!(
                "Host `{bad}` is not this server's address ({local}); a loopback server \
                 answers only localhost, 127.0.0.1 and [::1] (this refuses DNS-rebinding pages)"
            ),
            "host_not_allowed",
        );
    }
    let origin = match origin_of(headers, host, &access) {
        Ok(o) => o,
        Err(r) => return *r,
    };
    if let Some(o) = &origin {
        if req.method() == Method::OPTIONS
            && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            return with_cors(StatusCode::NO_CONTENT.into_response(), o, true);
        }
    }
    if let Some(key) = &access.api_key {
        let open = req.method() == Method::GET && ["/", "/health"].contains(&req.uri().path());
        if !open && !bearer_matches(headers, key) {
            let mut r = ApiError::request(
                "this server needs an API key: send `Authorization: Bearer <key>` with the key \
                 it was started with (--api-key)",
            )
            .status(StatusCode::UNAUTHORIZED)
            .with_code("invalid_api_key")
            .into_response();
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return match &origin {
                Some(o) => with_cors(r, o, false),
                None => r,
            };
        }
    }
    let r = next.run(req).await;
    match &origin {
        Some(o) => with_cors(r, o, false),
        None => r,
    }
}

/// The request's `Origin` when it is an allowed cross-origin one (`Ok(Some)`: CORS applies);
/// `Ok(None)` for none or the server's own; a 403 for any other (boxed: a response is large).
fn origin_of(
    headers: &HeaderMap,
    host: &str,
    access: &Access,
) -> Result<Option<String>, Box<Response>> {
    let Some(raw) = headers.get(header::ORIGIN) else {
        return Ok(None);
    };
    let o = raw.to_str().unwrap_or("").to_ascii_lowercase();
    // The page at `/` posts to its own origin (browsers send Origin with every POST).
    if o == format!("http://{}", host.to_ascii_lowercase()) {
        return Ok(None);
    }
    if access.allow_origins.contains(&o) {
        return Ok(Some(o));
    }
    Err(Box::new(forbidden(
        format!(
            "Origin `{}` is not allowed: a web page from another site may not use this \
             server; start it with --allow-origin {} to allow that page",
            String::from_utf8_lossy(raw.as_bytes()),
            String::from_utf8_lossy(raw.as_bytes()),
        ),
        "origin_not_allowed",
    )))
}

fn with_cors(mut r: Response, origin: &str, preflight: bool) -> Response {
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    if preflight {
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type"),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
    }
    r
}

/// `Authorization: Bearer <key>`, compared in time independent of where the keys differ.
fn bearer_matches(headers: &HeaderMap, key: &str) -> bool {
    let Some(v) = headers.get(header::AUTHORIZATION) else {
        return false;
    };
    let v = v.as_bytes();
    if v.len() < 7 || !v[..7].eq_ignore_ascii_case(b"bearer ") {
        return false;
    }
    let given = v[7..].trim_ascii();
    given.len() == key.len()
        && given
            .iter()
            .zip(key.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_the_local_address() {
        let lo: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        for h in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(host_allowed(h, lo), "{h}");
        }
        for h in [
            "evil.example",
            "evil.example:8080",
            "localhost:8081",
            "127.0.0.1:80",
            "127.0.0.2",
            "localhost.",
            "10.0.0.5:8080",
            "[::1]:x",
            "",
        ] {
            assert!(!host_allowed(h, lo), "{h}");
        }
        let lan: SocketAddr = "192.168.1.20:9000".parse().unwrap();
        assert!(host_allowed("192.168.1.20", lan));
        assert!(host_allowed("192.168.1.20:9000", lan));
        for h in [
            "localhost",
            "127.0.0.1:9000",
            "192.168.1.21",
            "192.168.1.20:9001",
            "x.lan",
        ] {
            assert!(!host_allowed(h, lan), "{h}");
        }
        let v6: SocketAddr = "[fe80::1]:9000".parse().unwrap();
        assert!(host_allowed("[fe80::1]:9000", v6));
        assert!(!host_allowed("fe80::1", v6));
        // A dual-stack socket reports IPv4 clients as IPv4-mapped IPv6.
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:8080".parse().unwrap();
        assert!(host_allowed("localhost:8080", mapped));
    }

    #[test]
    fn flags_are_checked() {
        assert!(Access::new(&["http://localhost:3000/".into()], None)
            .is_ok_and(|a| a.allow_origins == ["http://localhost:3000"]));
        for bad in [
            "*",
            "localhost:3000",
            "http://",
            "http://a/b",
            "https://*.example",
        ] {
            assert!(Access::new(&[bad.into()], None).is_err(), "{bad}");
        }
        assert!(Access::new(&[], Some("a key".into())).is_err());
        assert!(Access::new(&[], Some(String::new())).is_err());
        assert!(is_loopback_host("127.0.0.1") && is_loopback_host("::1"));
        assert!(is_loopback_host("localhost") && is_loopback_host("[::1]"));
        assert!(!is_loopback_host("0.0.0.0") && !is_loopback_host("example.org"));
    }

    #[test]
    fn bearer_keys_match_exactly() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            m
        };
        assert!(bearer_matches(&h("Bearer sk-1"), "sk-1"));
        assert!(bearer_matches(&h("bearer sk-1"), "sk-1"));
        for v in [
            "Bearer sk-2",
            "Bearer sk-10",
            "Basic sk-1",
            "sk-1",
            "Bearer ",
        ] {
            assert!(!bearer_matches(&h(v), "sk-1"), "{v}");
        }
        assert!(!bearer_matches(&HeaderMap::new(), "sk-1"));
    }
}
