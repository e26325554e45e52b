//! Connections: the accept loop, the connection cap and the header / idle timeouts, around
//! hyper's HTTP/1 connection serving the axum router.
//!
//! Every connection has at each moment one deadline or none:
//! - from accept, and from the first byte of each later request, `--header-timeout` to deliver
//!   the request's head (a half-sent head, a connection that never sends a byte);
//! - from the end of a response, `--idle-timeout` for the next request to start (keep-alive);
//! - none while a request is being answered: its response, a stream included, is never cut
//!   (reading its body is bounded in `routes`, the generation by `--timeout`).
//!
//! A connection past its deadline is closed. At most `--max-connections` are open at once; one
//! accepted beyond that is answered 503 and closed at once, and those being served are unaffected.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::guard::LocalAddr;

/// The connection limits of the server's flags.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// `--header-timeout`.
    pub header_timeout: Duration,
    /// `--idle-timeout`.
    pub idle_timeout: Duration,
    /// `--max-connections`.
    pub max_connections: usize,
}

/// Serve `router` on `listener` until `shutdown` completes; then stop accepting, let each
/// connection finish the request it is answering, and return once all are closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    eprintln!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        match slots.clone().try_acquire_owned() {
            Ok(permit) => {
                let (router, stop) = (router.clone(), stop_rx.clone());
                tokio::spawn(connection(stream, permit, router, limits, stop));
            }
            Err(_) => refuse(stream, limits.max_connections),
        }
    }
    let _ = stop_tx.send(true);
    let _ = slots.acquire_many(limits.max_connections as u32).await;
    Ok(())
}

/// A connection over the cap: a 503 if the socket takes it at once, then closed.
fn refuse(stream: TcpStream, max: usize) {
    let body = serde_json::json!({"error": {
        "message": format!("this server has {max} connections open, its limit \
                            (--max-connections); retry later"),
        "type": "rate_limit_error", "param": null, "code": "too_many_connections"}})
    .to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.try_write(format!("{head}{body}").as_bytes());
}

/// A connection's deadline state, shared by its socket (reads), its service (requests begun and
/// ended) and its watchdog.
struct Watch {
    phase: Mutex<Phase>,
    changed: Notify,
    limits: ConnLimits,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request's head (`idle`: not one byte of it yet) until `deadline`.
    Waiting { deadline: Instant, idle: bool },
    /// Answering this many requests (HTTP/1: one at a time; counted all the same).
    Busy(usize),
}

impl Watch {
    fn set(&self, f: impl FnOnce(Phase) -> Phase) {
        let mut p = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        *p = f(*p);
        drop(p);
        self.changed.notify_one();
    }

    /// Bytes arrived: the first of a request after an idle wait starts its header deadline.
    fn read(&self) {
        let idle = matches!(
            *self.phase.lock().unwrap_or_else(|e| e.into_inner()),
            Phase::Waiting { idle: true, .. }
        );
        if idle {
            let deadline = Instant::now() + self.limits.header_timeout;
            self.set(|p| match p {
                Phase::Waiting { idle: true, .. } => Phase::Waiting {
                    deadline,
                    idle: false,
                },
                other => other,
            });
        }
    }

    fn begin(self: &Arc<Self>) -> Busy {
        self.set(|p| match p {
            Phase::Busy(n) => Phase::Busy(n + 1),
            Phase::Waiting { .. } => Phase::Busy(1),
        });
        Busy(self.clone())
    }

    /// Completes when the connection has passed its deadline.
    async fn expired(&self) {
        loop {
            let phase = *self.phase.lock().unwrap_or_else(|e| e.into_inner());
            match phase {
                Phase::Busy(_) => self.changed.notified().await,
                Phase::Waiting { deadline, .. } if Instant::now() >= deadline => return,
                Phase::Waiting { deadline, .. } => tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => {}
                    _ = self.changed.notified() => {}
                },
            }
        }
    }
}

/// A request being answered; dropped with its response's body (sent, or the client left).
struct Busy(Arc<Watch>);

impl Drop for Busy {
    fn drop(&mut self) {
        let idle = self.0.limits.idle_timeout;
        self.0.set(|p| match p {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Waiting {
                deadline: Instant::now() + idle,
                idle: true,
            },
        });
    }
}

/// The socket, reporting reads to the watch. Its connection slot is released before the socket
/// closes (on shutdown, and by field order on drop), so a client that sees the close can connect
/// again at once.
struct Tracked {
    permit: Option<OwnedSemaphorePermit>,
    watch: Arc<Watch>,
    stream: TcpStream,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.watch.read();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.permit = None;
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Serve one connection until the client closes it, its deadline passes or the server stops.
async fn connection(
    stream: TcpStream,
    permit: OwnedSemaphorePermit,
    router: Router,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) {
    let Ok(local) = stream.local_addr() else {
        return;
    };
    // Streamed chunks go out as they are written, not after Nagle's delay.
    let _ = stream.set_nodelay(true);
    let watch = Arc::new(Watch {
        phase: Mutex::new(Phase::Waiting {
            deadline: Instant::now() + limits.header_timeout,
            idle: false,
        }),
        changed: Notify::new(),
        limits,
    });
    let io = TokioIo::new(Tracked {
        permit: Some(permit),
        watch: watch.clone(),
        stream,
    });
    let w = watch.clone();
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(LocalAddr(local));
        let busy = w.begin();
        let router = router.clone();
        async move {
            let resp = router.oneshot(req.map(Body::new)).await?;
            // `busy` lives as long as the body: hyper drops it once sent (or the client left).
            Ok::<_, std::convert::Infallible>(resp.map(|b| {
                Body::new(b.map_frame(move |f| {
                    let _ = &busy;
                    f
                }))
            }))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = watch.expired() => return,
            r = stop.changed(), if !stopping => {
                stopping = true;
                if r.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}
