//! The embedded demo origin behind `queuegate demo`: a small site with a few
//! pages, links and a JSON endpoint, so a newcomer can see queuegate work
//! without an application of their own.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// Serves the demo site on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener) {
    let hits = Arc::new(AtomicU64::new(0));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let hits = hits.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let n = hits.fetch_add(1, Ordering::Relaxed) + 1;
                async move { Ok::<_, Infallible>(page(&req, n)) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn page(req: &Request<Incoming>, hits: u64) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    let (status, content_type, body) = match path {
        "/" => (
            StatusCode::OK,
            "text/html; charset=utf-8",
            html("Demo shop", HOME),
        ),
        "/tickets" | "/tickets/" => (
            StatusCode::OK,
            "text/html; charset=utf-8",
            html("Tickets", TICKETS),
        ),
        p if p.starts_with("/tickets/seat") => (
            StatusCode::OK,
            "text/html; charset=utf-8",
            html("Your seat", SEAT),
        ),
        "/about" => (
            StatusCode::OK,
            "text/html; charset=utf-8",
            html("About", ABOUT),
        ),
        "/api/status" => (
            StatusCode::OK,
            "application/json",
            format!("{{\"ok\":true,\"served\":{hits}}}"),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/html; charset=utf-8",
            html("Not found", "<p>No such page. <a href=\"/\">Home</a></p>"),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn html(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{title}</title><style>body{{font-family:system-ui,sans-serif;max-width:40rem;\
         margin:2rem auto;padding:0 1rem;line-height:1.5}}nav a{{margin-right:1rem}}</style></head>\
         <body><nav><a href=\"/\">Home</a><a href=\"/tickets\">Tickets</a>\
         <a href=\"/about\">About</a></nav><h1>{title}</h1>{body}</body></html>"
    )
}

const HOME: &str = "<p>This is the demo application behind queuegate. The pages under \
<a href=\"/tickets\">/tickets</a> are gated: open them in a few private windows to see the \
waiting room.</p><p>The JSON endpoint <a href=\"/api/status\">/api/status</a> is not gated.</p>";

const TICKETS: &str = "<p>You are in. Pick a seat:</p><ul>\
<li><a href=\"/tickets/seat?n=1\">Seat 1</a></li>\
<li><a href=\"/tickets/seat?n=2\">Seat 2</a></li>\
<li><a href=\"/tickets/seat?n=3\">Seat 3</a></li></ul>";

const SEAT: &str = "<p>The seat is yours. <a href=\"/tickets\">Back to tickets</a></p>";

const ABOUT: &str = "<p>A tiny site that stands in for a real application.</p>";

/// `queuegate demo`: the demo origin on an ephemeral port, queuegate in front
/// of it on `listen` with the memory store and `/tickets` gated at
/// `capacity`, until SIGTERM or Ctrl-C.
pub async fn run(listen: std::net::SocketAddr, capacity: u64) -> anyhow::Result<()> {
    let origin = TcpListener::bind("127.0.0.1:0").await?;
    let origin_addr = origin.local_addr()?;
    tokio::spawn(serve(origin));
    let config = crate::config::Config::from_yaml(&format!(
        "listen: [{{ addr: \"{listen}\" }}]\n\
         upstream: {{ url: \"http://{origin_addr}\" }}\n\
         keys: [{{ id: demo, env: QUEUEGATE_DEMO_KEY_UNUSED }}]\n\
         routes:\n\
         \x20 - name: tickets\n\
         \x20   match: {{ path_prefix: /tickets }}\n\
         \x20   capacity: {capacity}\n\
         \x20   session_ttl: 2m\n\
         \x20   pass_ttl: 20s\n\
         \x20   arrival_grace: 20s\n\
         \x20   abandon_after: 20s\n"
    ))
    .map_err(|e| anyhow::anyhow!("demo config: {e}"))?;
    let ring = crate::admission::KeyRing::new(vec![(
        "demo".to_owned(),
        crate::admission::new_visitor_id()
            .iter()
            .chain(crate::admission::new_visitor_id().iter())
            .copied()
            .collect(),
    )])?;
    let listeners = crate::Listeners::bind(&config).await?;
    println!();
    println!("  queuegate demo is running.");
    println!("  Open http://{listen}/ and then http://{listen}/tickets");
    println!("  /tickets admits {capacity} visitors at a time: open it in a few private windows");
    println!("  to see the waiting room; close one (or use its Leave button) to let the next in.");
    println!("  Ctrl-C stops it.");
    println!();
    crate::run_with(config, ring, listeners, crate::shutdown::signal()).await
}
