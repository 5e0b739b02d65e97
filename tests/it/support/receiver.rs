//! A scriptable HTTP receiver on 127.0.0.1:0, written on raw TCP so it can misbehave the
//! ways real receivers do: answer late, stall after the status line, reset the connection.
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What to do with one request.
#[derive(Debug, Clone, Copy)]
pub enum Behaviour {
    Status(u16),
    /// Wait, then answer.
    Delay(Duration, u16),
    /// Send a 2xx status line and headers announcing a body, then never send it.
    StallAfterStatus(u16),
    /// Send the status line, then the body one byte every 200 ms.
    SlowBody(u16),
    /// Close the connection without answering (RST).
    Reset,
    /// Answer with `Retry-After: secs`.
    RetryAfter(u16, u64),
    /// Answer with a redirect to the URL set by `set_location`.
    Redirect(u16),
    /// Answer with the request's own body (a receiver that echoes what it got).
    Echo(u16),
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The request line's method and target (path and query).
    pub request_line: String,
    pub headers: HashMap<String, String>,
    pub body: String,
    pub at: Instant,
    /// The status line this receiver sent (none for a reset), even when the body then
    /// never came.
    pub answered: Option<u16>,
}

#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    script: Arc<Mutex<VecDeque<Behaviour>>>,
    default: Behaviour,
    pub received: Arc<Mutex<Vec<Received>>>,
    location: Arc<Mutex<String>>,
    poison: Arc<Mutex<Option<String>>>,
}

impl Receiver {
    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|rest| rest.split('/').next())
            .and_then(|p| p.parse().ok())
            .expect("receiver port")
    }

    /// Answers 500 to every request whose body contains `marker`, whatever the script says.
    pub fn set_poison(&self, marker: &str) {
        *self.poison.lock().expect("lock") = Some(marker.to_owned());
    }

    pub fn set_location(&self, url: &str) {
        *self.location.lock().expect("lock") = url.to_owned();
    }

    /// Follows `script` request by request, then `default` for ever.
    pub async fn start(script: Vec<Behaviour>, default: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::serve_on(listener, script, default)
    }

    /// The same, on a listener bound elsewhere (a far host: `netns::FarHost::bind`).
    pub fn start_on(
        listener: std::net::TcpListener,
        script: Vec<Behaviour>,
        default: Behaviour,
    ) -> Self {
        let listener = TcpListener::from_std(listener).expect("tokio listener");
        Self::serve_on(listener, script, default)
    }

    fn serve_on(listener: TcpListener, script: Vec<Behaviour>, default: Behaviour) -> Self {
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let r = Self {
            url,
            script: Arc::new(Mutex::new(script.into())),
            default,
            received: Arc::new(Mutex::new(Vec::new())),
            location: Arc::new(Mutex::new(String::new())),
            poison: Arc::new(Mutex::new(None)),
        };
        let me = r.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let me = me.clone();
                tokio::spawn(async move { me.serve(stream).await });
            }
        });
        r
    }

    pub fn count(&self) -> usize {
        self.received.lock().expect("lock").len()
    }

    pub fn requests(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }

    async fn serve(&self, mut stream: TcpStream) {
        loop {
            let Some(request) = read_request(&mut stream).await else {
                return;
            };
            let mut request = request;
            let poisoned = self
                .poison
                .lock()
                .expect("lock")
                .as_ref()
                .is_some_and(|m| request.body.contains(m.as_str()));
            let behaviour = if poisoned {
                Behaviour::Status(500)
            } else {
                self.script
                    .lock()
                    .expect("lock")
                    .pop_front()
                    .unwrap_or(self.default)
            };
            request.answered = match behaviour {
                Behaviour::Status(c)
                | Behaviour::Redirect(c)
                | Behaviour::RetryAfter(c, _)
                | Behaviour::Delay(_, c)
                | Behaviour::SlowBody(c)
                | Behaviour::StallAfterStatus(c)
                | Behaviour::Echo(c) => Some(c),
                Behaviour::Reset => None,
            };
            let echoed = request.body.clone();
            self.received.lock().expect("lock").push(request);
            let ok = match behaviour {
                Behaviour::Status(code) => respond(&mut stream, code, "").await,
                Behaviour::Echo(code) => respond_with(&mut stream, code, "", &echoed).await,
                Behaviour::Redirect(code) => {
                    let location = self.location.lock().expect("lock").clone();
                    respond(&mut stream, code, &format!("location: {location}\r\n")).await
                }
                Behaviour::RetryAfter(code, secs) => {
                    respond(&mut stream, code, &format!("retry-after: {secs}\r\n")).await
                }
                Behaviour::Delay(wait, code) => {
                    tokio::time::sleep(wait).await;
                    respond(&mut stream, code, "").await
                }
                Behaviour::StallAfterStatus(code) => {
                    let head = format!("HTTP/1.1 {code} OK\r\ncontent-length: 1000\r\n\r\npartial");
                    let _ = stream.write_all(head.as_bytes()).await;
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    false
                }
                Behaviour::SlowBody(code) => {
                    let body = "slowly, slowly";
                    let head = format!(
                        "HTTP/1.1 {code} OK\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    let mut ok = stream.write_all(head.as_bytes()).await.is_ok();
                    for byte in body.bytes() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        ok &= stream.write_all(&[byte]).await.is_ok();
                    }
                    ok
                }
                Behaviour::Reset => {
                    // Zero linger makes the close an RST, which is the point here; the
                    // deprecation is about blocking on drop, which a zero linger never does.
                    #[allow(deprecated)]
                    let _ = stream.set_linger(Some(Duration::ZERO));
                    false
                }
            };
            if !ok {
                return;
            }
        }
    }
}

async fn respond(stream: &mut TcpStream, code: u16, extra: &str) -> bool {
    respond_with(stream, code, extra, "ok").await
}

async fn respond_with(stream: &mut TcpStream, code: u16, extra: &str, body: &str) -> bool {
    let head = format!(
        "HTTP/1.1 {code} X\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.is_ok()
}

async fn read_request(stream: &mut TcpStream) -> Option<Received> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
    let headers: HashMap<String, String> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < header_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[header_end..header_end + length]).to_string();
    Some(Received {
        request_line: head
            .lines()
            .next()
            .unwrap_or("")
            .trim_end_matches(" HTTP/1.1")
            .to_owned(),
        headers,
        body,
        at: Instant::now(),
        answered: None,
    })
}
