//! Test origins on ephemeral ports: HTTP ones answered by a handler, and
//! raw-byte ones handed each accepted socket.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub type OriginBody = BoxBody<Bytes, Infallible>;

/// A test origin: its address, how many connections it accepted, and the
/// task serving it (aborted on drop).
pub struct Origin {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Origin {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn accepted(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A whole body for an origin's response.
pub fn full(bytes: impl Into<Bytes>) -> OriginBody {
    Full::new(bytes.into()).boxed()
}

/// Starts an HTTP origin whose every request is answered by `handler`.
pub async fn spawn_origin<F, Fut>(handler: F) -> Origin
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<OriginBody>> + Send + 'static,
{
    spawn_raw_origin(move |stream| {
        let handler = handler.clone();
        async move {
            let service = service_fn(move |req| {
                let fut = handler(req);
                async move { Ok::<_, Infallible>(fut.await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await;
        }
    })
    .await
}

/// A raw-byte origin: `handler` gets each accepted socket as it is.
pub async fn spawn_raw_origin<F, Fut>(handler: F) -> Origin
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(handler(stream));
        }
    });
    Origin {
        addr,
        connections,
        task,
    }
}

/// An origin that answers 200 with the path, counting requests.
pub async fn counting_origin() -> (Origin, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let origin = spawn_origin(move |req: Request<Incoming>| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            let cookies = req
                .headers()
                .get_all("cookie")
                .iter()
                .map(|v| v.to_str().unwrap_or("").to_owned())
                .collect::<Vec<_>>()
                .join("; ");
            let mut resp = Response::new(full(format!("origin {}", req.uri())));
            resp.headers_mut().insert(
                "x-origin-cookies",
                cookies
                    .parse()
                    .unwrap_or(http::HeaderValue::from_static("")),
            );
            resp
        }
    })
    .await;
    (origin, hits)
}
