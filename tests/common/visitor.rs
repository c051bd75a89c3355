//! Clients: a `Visitor` (a browser or app with a cookie jar), one-shot
//! requests, and `KeepAlive`, one connection whose requests are written by
//! hand.

use std::net::SocketAddr;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// queuegate answering somewhere a visitor can be sent: in-process
/// (`Gate`), as a child process (`Process`) or as one of several sharing a
/// Redis (`Instance`).
pub trait PublicUrl {
    /// The URL of `path` on its public listener.
    fn url(&self, path: &str) -> String;
}

/// A plain HTTP client with a body type that can stream.
pub fn client<B>() -> Client<HttpConnector, B>
where
    B: http_body::Body + Send + 'static + Unpin,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends `req` with a whole body and reads the whole answer.
pub async fn send(req: Request<Full<Bytes>>) -> (http::response::Parts, Bytes) {
    let resp = client::<Full<Bytes>>().request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts, bytes)
}

/// `GET url` with no extra headers.
pub async fn get(url: &str) -> (http::response::Parts, Bytes) {
    send(Request::get(url).body(Full::new(Bytes::new())).unwrap()).await
}

/// One browser (or app): a cookie jar, no redirects followed.
#[derive(Clone, Default)]
pub struct Visitor {
    pub jar: std::collections::BTreeMap<String, String>,
}

/// What a visitor got back.
#[derive(Debug)]
pub struct Answer {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// Whether the origin answered (not queuegate).
    pub fn reached_origin(&self) -> bool {
        self.headers.get("x-queuegate").is_none() && self.status == http::StatusCode::OK
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
    pub fn location(&self) -> Option<&str> {
        self.headers.get("location").and_then(|v| v.to_str().ok())
    }
}

impl Visitor {
    pub fn new() -> Visitor {
        Visitor::default()
    }

    /// A visitor whose jar holds `value` as cookie `name`, as a client
    /// replaying a cookie it kept would.
    pub fn holding(name: &str, value: &str) -> Visitor {
        let mut v = Visitor::new();
        v.jar.insert(name.to_owned(), value.to_owned());
        v
    }

    fn cookie_header(&self) -> Option<String> {
        if self.jar.is_empty() {
            return None;
        }
        Some(
            self.jar
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("; "),
        )
    }

    /// Sends a request built by `build` with the jar's cookies; keeps cookies set.
    pub async fn request(&mut self, mut req: Request<Full<Bytes>>) -> Answer {
        if let Some(c) = self.cookie_header() {
            req.headers_mut().insert("cookie", c.parse().unwrap());
        }
        let resp = client::<Full<Bytes>>().request(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        self.store_cookies(&parts.headers);
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub fn store_cookies(&mut self, headers: &http::HeaderMap) {
        for set in headers.get_all("set-cookie") {
            let text = set.to_str().unwrap();
            let first = text.split(';').next().unwrap();
            let (name, value) = first.split_once('=').unwrap();
            let removed = text.contains("Max-Age=0");
            if removed || value.is_empty() {
                self.jar.remove(name);
            } else {
                self.jar.insert(name.to_owned(), value.to_owned());
            }
        }
    }

    /// A browser navigation to `url`.
    pub async fn navigate(&mut self, url: &str) -> Answer {
        let req = Request::get(url)
            .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
            .header("sec-fetch-mode", "navigate")
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.request(req).await
    }

    /// An XHR/fetch call to `url`.
    pub async fn fetch(&mut self, url: &str) -> Answer {
        let req = Request::get(url)
            .header("accept", "application/json")
            .header("sec-fetch-mode", "cors")
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.request(req).await
    }

    /// A POST with a body.
    pub async fn post(&mut self, url: &str, body: &str) -> Answer {
        let req = Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        self.request(req).await
    }

    /// Polls the status endpoint of `route` on `at`.
    pub async fn status(&mut self, at: &impl PublicUrl, route: &str) -> serde_json::Value {
        let answer = self
            .fetch(&at.url(&format!("/__queuegate/status?route={route}")))
            .await;
        assert_eq!(answer.status, http::StatusCode::OK);
        answer.json()
    }

    /// Leaves `route` on `at`.
    pub async fn leave(&mut self, at: &impl PublicUrl, route: &str) -> Answer {
        self.post(&at.url(&format!("/__queuegate/leave?route={route}")), "")
            .await
    }

    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.jar.get(name).map(String::as_str)
    }
}

/// One client connection kept open, its requests written by hand, so that
/// every request goes over the same socket (a pooled client may open others).
pub struct KeepAlive {
    stream: tokio::net::TcpStream,
    pending: Vec<u8>,
}

impl KeepAlive {
    pub async fn connect(addr: SocketAddr) -> KeepAlive {
        KeepAlive {
            stream: tokio::net::TcpStream::connect(addr).await.unwrap(),
            pending: Vec::new(),
        }
    }

    /// `GET path` with `cookie` as the `Cookie` header (none when empty):
    /// the status and the head as sent (hyper sends lower-case names). The
    /// answer must keep the connection open and carry a Content-Length.
    pub async fn get(&mut self, path: &str, cookie: &str) -> (http::StatusCode, String) {
        let cookie = if cookie.is_empty() {
            String::new()
        } else {
            format!("Cookie: {cookie}\r\n")
        };
        let req = format!("GET {path} HTTP/1.1\r\nHost: keepalive.test\r\n{cookie}\r\n");
        let (status, head) = self.send(req.as_bytes()).await;
        assert!(!head.contains("connection: close"), "closed: {head}");
        (status, head)
    }

    /// Writes `request` as it is and reads one answer: its status and
    /// head. The answer must carry a Content-Length, or be a `101`.
    pub async fn send(&mut self, request: &[u8]) -> (http::StatusCode, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.stream.write_all(request).await.unwrap();
        loop {
            if let Some(end) = self.pending.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.pending[..end]).into_owned();
                let status = head[9..12].parse::<u16>().unwrap();
                let length: usize = head
                    .to_ascii_lowercase()
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().unwrap())
                    .or((status == 101).then_some(0))
                    .unwrap_or_else(|| panic!("no content-length: {head}"));
                if self.pending.len() >= end + 4 + length {
                    self.pending.drain(..end + 4 + length);
                    return (http::StatusCode::from_u16(status).unwrap(), head);
                }
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the connection closed before the answer");
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }

    /// Writes `bytes` and reads what comes back until queuegate closes the
    /// connection (failing after 10 s).
    pub async fn finish(mut self, bytes: &[u8]) -> Vec<u8> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Written to a connection queuegate may have closed already.
        let _ = self.stream.write_all(bytes).await;
        let mut out = std::mem::take(&mut self.pending);
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            self.stream.read_to_end(&mut out),
        )
        .await
        .expect("queuegate closes the connection within 10 s")
        .ok();
        out
    }
}

/// `v`'s status of the route `tickets` (as `gated` and `RouteYaml` name it)
/// on `at`.
pub async fn status(v: &mut Visitor, at: &impl PublicUrl) -> serde_json::Value {
    v.status(at, "tickets").await
}
