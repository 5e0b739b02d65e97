//! The one HTTP accept loop, for the REST API and the `/metrics` listeners.
//!
//! Connections are served by hyper directly rather than through `axum::serve`, which
//! gives hyper no timer: without one, hyper's header read timeout never runs, and a client
//! that sends half a request line and then nothing holds its socket for as long as it
//! likes (slowloris). Here every connection has `header_timeout` to finish its headers
//! (the same bound closes a kept-alive connection left idle that long).

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// Serves `app` until `shutdown` resolves, then stops accepting, closes idle connections
/// and waits for in-flight requests to finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let mut connections = Builder::new(TokioExecutor::new());
    connections
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: the listener itself is fine,
                    // so wait a little for sockets to close instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let conn = connections
            .serve_connection_with_upgrades(
                TokioIo::new(stream),
                TowerToHyperService::new(app.clone()),
            )
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    async fn read_all(s: &mut TcpStream, within: Duration) -> Option<String> {
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Some(String::from_utf8_lossy(&got).into()),
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                Err(_) => return None,
            }
        }
    }

    #[tokio::test]
    async fn half_sent_headers_are_closed_and_whole_requests_answered() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("test step");
        let addr = listener.local_addr().expect("test step");
        let app = Router::new().route("/", get(|| async { "ok" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app, Duration::from_secs(1), async {
            let _ = stopped.await;
        }));

        let mut slow = TcpStream::connect(addr).await.expect("test step");
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Par")
            .await
            .expect("test step");
        let mut whole = TcpStream::connect(addr).await.expect("test step");
        whole
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("test step");
        let answer = read_all(&mut whole, Duration::from_secs(5))
            .await
            .expect("test step");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            read_all(&mut slow, Duration::from_secs(4)).await.is_some(),
            "a half-sent request was still open 4 s on, past the 1 s header timeout"
        );

        stop.send(()).expect("test step");
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("shutdown finishes")
            .expect("test step")
            .expect("test step");
    }
}
