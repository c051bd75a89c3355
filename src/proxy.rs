//! Forwarding to the origin over the `upstream` pool: header rewriting,
//! sending a request again when its pooled connection turns out closed by
//! the origin, `Upgrade` pass-through (tunnels that keep their client
//! connection's slot, end after `limits.tunnel_idle_timeout` of silence and
//! at the drain deadline), and the 502/504 answers when the origin fails.
//!
//! It does not decide whether a request may pass: the gate does, before this.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::client_body;
use crate::client_request::ClientRequest;
use crate::message::Answer;
use http::header::{self, HeaderName, HeaderValue};
use http::uri::{PathAndQuery, Scheme};
use http::{Method, StatusCode, Uri, Version};
use http_body::Body as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::Instant;

use crate::client_ip;
use crate::config;
use crate::fields::{Fields, Headers};
use crate::metrics::{ConnectionMetrics, Protocol};
use crate::response::{Body, RequestError};
use crate::upstream::{
    self, Handed, Origin, OriginBody, OriginRequest, Outgoing, Pool, Pooled, Sent, UpstreamBody,
};

/// Headers that describe one connection, not the message (RFC 9110
/// §7.6.1), with `HTTP2-Settings`, which only an `h2c` upgrade reads (RFC
/// 7540 §3.2.1): never forwarded.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("http2-settings"),
];

/// [`HOP_BY_HOP`]'s names as text, in the same order, for a look along a
/// message's fields that compares lengths first.
const HOP_BY_HOP_NAMES: [&str; 7] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "transfer-encoding",
    "upgrade",
    "http2-settings",
];

/// The one protocol an upgrade may switch to through queuegate (DESIGN
/// §9.5): a tunnel to anything else (`h2c` above all) would carry requests
/// past the gate.
const WEBSOCKET: HeaderValue = HeaderValue::from_static("websocket");

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// The client at the other end of a connection, with its `X-Forwarded-For`
/// entry made once when the connection is accepted rather than per request.
#[derive(Clone, Debug)]
pub struct Peer {
    /// The client's socket address.
    pub addr: SocketAddr,
    /// Whether the client reached queuegate over TLS.
    pub tls: bool,
    forwarded_for: HeaderValue,
    /// The worker thread serving the connection: its requests use that
    /// worker's share of the upstream pool.
    worker: usize,
    /// What a tunnel made from this connection holds; `None`: tunnels run
    /// until either side closes.
    lease: Option<Lease>,
}

/// What a tunnel takes over from the client connection it came from: the
/// connection's slot (so tunnels count against `limits.max_connections`), a
/// drain receiver (so the drain waits for it), the signal that the drain
/// deadline has come, and how long it may stay silent.
#[derive(Clone, Debug)]
pub struct Lease {
    _slot: Arc<OwnedSemaphorePermit>,
    _drain: watch::Receiver<bool>,
    closing: watch::Receiver<bool>,
    idle_timeout: Duration,
}

impl Lease {
    /// `closing` turns true at the drain deadline; `idle_timeout` is
    /// `limits.tunnel_idle_timeout`.
    pub fn new(
        slot: Arc<OwnedSemaphorePermit>,
        drain: watch::Receiver<bool>,
        closing: watch::Receiver<bool>,
        idle_timeout: Duration,
    ) -> Lease {
        Lease {
            _slot: slot,
            _drain: drain,
            closing,
            idle_timeout,
        }
    }
}

impl Peer {
    /// Describes the client at `addr`, over TLS or not (an IPv4-mapped IPv6
    /// address is forwarded as IPv4).
    pub fn new(addr: SocketAddr, tls: bool) -> Peer {
        let ip = addr.ip().to_canonical().to_string();
        // An IP address in text is always a valid header value.
        let forwarded_for = HeaderValue::from_maybe_shared(bytes::Bytes::from(ip))
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        Peer {
            addr,
            tls,
            forwarded_for,
            worker: 0,
            lease: None,
        }
    }

    /// The same client, served by worker thread `worker`.
    pub fn on_worker(self, worker: usize) -> Peer {
        Peer { worker, ..self }
    }

    /// The same client, whose tunnels hold `lease`.
    pub fn with_lease(self, lease: Lease) -> Peer {
        Peer {
            lease: Some(lease),
            ..self
        }
    }
}

/// Why the upstream could not be set up (a start-up error; config
/// validation reports the url and host problems first).
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream.url: scheme {0} is not supported")]
    Scheme(Scheme),
    #[error("upstream.url: a host is required")]
    NoHost,
    #[error("upstream.url: {0:?} is not a valid TLS server name")]
    ServerName(String),
    #[error("upstream.host: {host:?} is not a valid Host: {source}")]
    Host {
        host: String,
        #[source]
        source: http::header::InvalidHeaderValue,
    },
    /// The CA file cannot be read, or is not PEM.
    #[error("upstream.ca_file: {}: {source}", path.display())]
    CaFile {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("upstream.ca_file: {}: no PEM certificate found", path.display())]
    NoCaCertificate { path: PathBuf },
    /// A certificate in the CA file is not a usable trust anchor.
    #[error("upstream.ca_file: {}: {source}", path.display())]
    CaCertificate {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("upstream TLS: {0}")]
    Tls(#[source] rustls::Error),
}

/// The origin and the pool of connections that reach it: one share per
/// worker thread, so a request is written to an origin connection driven
/// by the thread (and the task) that serves its client, never handed across
/// threads.
pub struct Upstream {
    pool: Pool,
    host: Option<HeaderValue>,
    /// The `Host` sent when the client named none: the upstream URL's.
    default_host: HeaderValue,
    /// Whose forwarding headers are believed.
    client_ip: config::ClientIp,
    timeout: Duration,
    /// Where open tunnels (upgraded connections) are counted.
    connections: ConnectionMetrics,
}

impl Upstream {
    /// Sets up the pool from `upstream` (validated config) for `workers`
    /// worker threads; `upstream.pool.max_idle_per_host` is shared out among
    /// them. Tunnels are counted in `connections`.
    pub fn new(
        cfg: &config::Upstream,
        client_ip: &config::ClientIp,
        workers: usize,
        connections: ConnectionMetrics,
    ) -> Result<Upstream, UpstreamError> {
        let scheme = cfg.url.scheme().cloned().unwrap_or(Scheme::HTTP);
        let tls = if scheme == Scheme::HTTP {
            false
        } else if scheme == Scheme::HTTPS {
            true
        } else {
            return Err(UpstreamError::Scheme(scheme));
        };
        let authority = cfg.url.authority().cloned().ok_or(UpstreamError::NoHost)?;
        let host = match &cfg.host {
            Some(h) => Some(
                HeaderValue::from_str(h).map_err(|source| UpstreamError::Host {
                    host: h.clone(),
                    source,
                })?,
            ),
            None => None,
        };
        let default_host =
            HeaderValue::from_str(authority.as_str()).map_err(|source| UpstreamError::Host {
                host: authority.to_string(),
                source,
            })?;
        // `[::1]` in a URL, `::1` for the socket and the server name.
        let name = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        // The server name (SNI and the name checked in the certificate) is
        // the upstream URL's host. The request is always HTTP/1.1.
        let tls = if tls {
            let server_name = ServerName::try_from(name.clone())
                .map_err(|_| UpstreamError::ServerName(name.clone()))?;
            Some((Arc::new(client_tls(cfg.ca_file.as_deref())?), server_name))
        } else {
            None
        };
        let workers = workers.max(1);
        let origin = Origin {
            host: name,
            port,
            tls,
            connect_timeout: cfg.connect_timeout,
        };
        Ok(Upstream {
            pool: Pool::new(
                origin,
                workers,
                cfg.pool.max_idle_per_host.div_ceil(workers),
                cfg.pool.idle_timeout,
            ),
            host,
            default_host,
            client_ip: client_ip.clone(),
            timeout: cfg.timeout,
            connections,
        })
    }

    /// How long the origin has for a response head (`upstream.timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Forwards `req` from `peer` to the origin and streams the answer
    /// back, without the fields `withheld` in its headers or its trailers.
    ///
    /// The request is rewritten before this returns, so the future holds
    /// only the exchange in flight: it is part of every proxied request's
    /// future, which is moved into place once per request.
    ///
    /// A request that finds its pooled connection closed by the origin
    /// (which may close an idle connection at any time) is sent again on a
    /// new one if it was never written, or if it is idempotent and has no
    /// body, as nginx does.
    pub fn forward<'a>(
        &'a self,
        mut req: ClientRequest,
        peer: &Peer,
        withheld: &'static [HeaderName],
    ) -> impl Future<Output = Result<Answer<Body>, RequestError>> + Send + 'a {
        // Only a WebSocket handshake over HTTP/1.1 is passed on as an
        // upgrade; the engine gives each such request its way to the
        // connection.
        let client_upgrade = asks_websocket(&req)
            .then(|| req.take_upgrade())
            .flatten()
            .map(|on| {
                let tunnel = Tunnel {
                    connections: self.connections.clone(),
                    lease: peer.lease.clone(),
                };
                (on, tunnel)
            });
        let upgrade = client_upgrade.is_some();
        let prepared = self.rewrite(req, peer, upgrade, withheld);
        let worker = peer.worker;
        async move {
            let (method, uri, _, fields, body) = prepared?.into_parts();
            // HTTP/1.1 to the origin, whatever the client spoke: its
            // framing (a body of unknown length chunked) is chosen for it.
            let req = OriginRequest {
                method,
                uri,
                version: Version::HTTP_11,
                fields,
                body: Outgoing::Client { body, withheld },
            };
            let exchange = self.exchange(req, worker);
            let Sent {
                response,
                connection,
            } = match tokio::time::timeout(self.timeout, exchange).await {
                Ok(Ok(sent)) => sent,
                Ok(Err(err)) => return Err(err.into()),
                Err(_) => return Err(RequestError::UpstreamTimeout),
            };
            if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                // Only the WebSocket handshake forwarded may switch; the
                // origin's connection is closed on any other `101`.
                return match client_upgrade {
                    Some((client_upgrade, tunnel)) if switches_to_websocket(&response) => Ok(
                        switch_protocols(response, connection, client_upgrade, tunnel),
                    ),
                    _ => Err(RequestError::UnaskedSwitch),
                };
            }
            let mut resp = response.map(|body| Body::Upstream(UpstreamBody::new(body, connection)));
            strip_hop_by_hop(resp.headers_mut());
            Ok(resp)
        }
    }

    /// Sends `req` on a pooled connection of `worker`'s share, or a new
    /// one, until its response head arrives.
    async fn exchange(&self, req: OriginRequest, worker: usize) -> Result<Sent, upstream::Error> {
        let req = match self.pool.checkout(worker) {
            None => req,
            Some(pooled) => {
                let again = Resend::of(&req);
                match pooled.send(req).await {
                    Ok(sent) => return Ok(sent),
                    Err(failed) => match failed.request {
                        // Never written: the connection was closed first.
                        Some(req) => req,
                        None => match again {
                            Some(again) if failed.reused && stale(&failed.error) => {
                                tracing::debug!(
                                    error = %failed.error,
                                    "pooled origin connection was closed: sending again"
                                );
                                again.request()
                            }
                            _ => return Err(failed.error),
                        },
                    },
                }
            }
        };
        // Boxed: connecting (TCP, TLS, the HTTP/1 handshake) is rare once
        // the pool is warm, and unboxed its state would add a kilobyte or
        // more to every request's future, which is moved whole.
        let pooled = Box::pin(self.pool.connect(worker)).await?;
        pooled.send(req).await.map_err(|failed| failed.error)
    }

    /// The request as the origin gets it: origin URL, HTTP/1.1, hop-by-hop
    /// headers removed (an `Upgrade` put back only for a WebSocket
    /// handshake, `upgrade`), and the headers `withheld`, forwarding headers
    /// set.
    fn rewrite(
        &self,
        mut req: ClientRequest,
        peer: &Peer,
        upgrade: bool,
        withheld: &[HeaderName],
    ) -> Result<ClientRequest, RequestError> {
        let original_host = original_host(&req);
        let path = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        // Origin-form: the connection is to the origin already.
        *req.uri_mut() = Uri::from(path);

        let trusted =
            !self.client_ip.trusted_proxies.is_empty() && self.client_ip.trusts(peer.addr.ip());
        let real_ip = (!self.client_ip.trusted_proxies.is_empty())
            .then(|| client_ip::client_of(peer.addr.ip(), req.headers(), &self.client_ip));
        let headers = req.headers_mut();
        strip_hop_by_hop(headers);
        for name in withheld {
            headers.remove(name);
        }
        // DESIGN §8.2: what a client says about itself in forwarding headers
        // reaches the origin only through a trusted proxy.
        if trusted {
            append_forwarded_for(headers, peer);
        } else {
            headers.insert(X_FORWARDED_FOR.clone(), peer.forwarded_for.clone());
            headers.remove(header::FORWARDED);
        }
        match real_ip {
            Some(ip) if ip != peer.addr.ip().to_canonical() => {
                if let Ok(v) = HeaderValue::from_str(&ip.to_string()) {
                    headers.insert(X_REAL_IP.clone(), v);
                }
            }
            _ => {
                headers.insert(X_REAL_IP.clone(), peer.forwarded_for.clone());
            }
        }
        if !trusted || !headers.contains_key(&X_FORWARDED_PROTO) {
            headers.insert(
                X_FORWARDED_PROTO.clone(),
                HeaderValue::from_static(if peer.tls { "https" } else { "http" }),
            );
        }
        if let Some(host) = original_host {
            if !trusted || !headers.contains_key(&X_FORWARDED_HOST) {
                headers.insert(X_FORWARDED_HOST.clone(), host.clone());
            }
            match &self.host {
                Some(configured) => {
                    headers.insert(header::HOST, configured.clone());
                }
                None => {
                    headers.insert(header::HOST, host);
                }
            }
        } else {
            if !trusted {
                headers.remove(&X_FORWARDED_HOST);
            }
            let host = self.host.as_ref().unwrap_or(&self.default_host);
            headers.insert(header::HOST, host.clone());
        }
        if upgrade {
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(header::UPGRADE, WEBSOCKET);
        }
        Ok(req)
    }
}

/// The TLS client config for an https:// upstream: the compiled-in Mozilla
/// roots plus the certificates in `ca_file` (a private CA), if given.
fn client_tls(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, UpstreamError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let unreadable = |source| UpstreamError::CaFile {
            path: path.to_owned(),
            source,
        };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(unreadable)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(unreadable)?;
        if certs.is_empty() {
            return Err(UpstreamError::NoCaCertificate {
                path: path.to_owned(),
            });
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|source| UpstreamError::CaCertificate {
                    path: path.to_owned(),
                    source,
                })?;
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(UpstreamError::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A tunnel about to be made: where it is counted, and what it holds.
struct Tunnel {
    connections: ConnectionMetrics,
    lease: Option<Lease>,
}

impl Tunnel {
    /// Joins both upgraded connections until either side closes, the
    /// tunnel stays silent for the lease's idle timeout, or the drain
    /// deadline comes; counted as a tunnel meanwhile.
    async fn run(self, client: Box<dyn client_body::Io>, mut origin: Handed) {
        let _open = self.connections.open(Protocol::Tunnel);
        let heard = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let mut client = Heard {
            io: client,
            started,
            heard: heard.clone(),
        };
        let copy = tokio::io::copy_bidirectional(&mut client, &mut origin);
        let Some(mut lease) = self.lease else {
            if let Err(err) = copy.await {
                tracing::debug!(error = %err, "upgraded connection ended");
            }
            return;
        };
        tokio::pin!(copy);
        let idle = lease.idle_timeout;
        let quiet = tokio::time::sleep(idle);
        tokio::pin!(quiet);
        let closing = lease.closing.wait_for(|closing| *closing);
        tokio::pin!(closing);
        loop {
            tokio::select! {
                copied = &mut copy => {
                    if let Err(err) = copied {
                        tracing::debug!(error = %err, "upgraded connection ended");
                    }
                    return;
                }
                () = &mut quiet => {
                    let last = started + Duration::from_nanos(heard.load(Ordering::Relaxed));
                    if last + idle <= Instant::now() {
                        tracing::debug!(?idle, "tunnel silent too long: closing");
                        return;
                    }
                    quiet.as_mut().reset(last + idle);
                }
                _ = &mut closing => {
                    tracing::debug!("drain deadline: closing the tunnel");
                    return;
                }
            }
        }
    }
}

/// The client side of a tunnel, noting when bytes last moved either way.
struct Heard<T> {
    io: T,
    started: Instant,
    /// Nanoseconds from `started` to the last read or write.
    heard: Arc<AtomicU64>,
}

impl<T> Heard<T> {
    fn note<R>(&self, polled: &Poll<io::Result<R>>) {
        if let Poll::Ready(Ok(_)) = polled {
            let nanos = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.heard.store(nanos, Ordering::Relaxed);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Heard<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        self.note(&polled);
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Heard<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.note(&polled);
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Answers the client's `101` and makes the tunnel between both upgraded
/// connections (see [`Tunnel::run`]), once `connection` (the origin's) has
/// handed its socket over.
fn switch_protocols(
    resp: Answer<OriginBody>,
    connection: Pooled,
    client_upgrade: client_body::OnUpgrade,
    tunnel: Tunnel,
) -> Answer<Body> {
    tokio::spawn(async move {
        let (client, origin) = tokio::join!(client_upgrade.upgraded(), connection.upgraded());
        let (client, origin) = match (client, origin) {
            (Some(client), Some(origin)) => (client, origin),
            (None, _) => {
                tracing::debug!("the client's upgrade did not complete");
                return;
            }
            (_, None) => {
                tracing::debug!("the origin's connection ended before the upgrade");
                return;
            }
        };
        tunnel.run(Box::new(client), origin).await;
    });
    let (mut parts, _) = resp.into_parts();
    strip_hop_by_hop(&mut parts.fields);
    parts
        .fields
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    parts.fields.insert(header::UPGRADE, WEBSOCKET);
    Answer::from_parts(parts, Body::Empty)
}

/// What it takes to send a request again: kept only for an idempotent
/// request without a body (RFC 9110 §9.2.2), the kind a proxy may retry.
struct Resend {
    method: Method,
    uri: Uri,
    fields: Fields,
}

impl Resend {
    fn of(req: &OriginRequest) -> Option<Resend> {
        let idempotent = matches!(
            req.method,
            Method::GET
                | Method::HEAD
                | Method::OPTIONS
                | Method::TRACE
                | Method::PUT
                | Method::DELETE
        );
        (idempotent && req.body.is_end_stream()).then(|| Resend {
            method: req.method.clone(),
            uri: req.uri.clone(),
            fields: req.fields.clone(),
        })
    }

    fn request(self) -> OriginRequest {
        OriginRequest {
            method: self.method,
            uri: self.uri,
            version: Version::HTTP_11,
            fields: self.fields,
            body: Outgoing::Empty,
        }
    }
}

/// Whether an exchange failed the way one does on a connection the origin
/// had closed while it was idle: closed or reset before any byte of the
/// answer came.
fn stale(err: &upstream::Error) -> bool {
    matches!(err, upstream::Error::Http(err) if err.unanswered())
}

/// Rejects the requests that are never forwarded, whatever their path:
/// `CONNECT` (a tunnel to a place of the client's choosing, which a reverse
/// proxy does not make) and those whose framing is ambiguous.
pub fn check_request(req: &ClientRequest) -> Result<(), RequestError> {
    if req.method() == Method::CONNECT {
        return Err(RequestError::Connect);
    }
    check_framing(req.headers())
}

/// Rejects requests whose body length could be read two ways (RFC 9112
/// §6.3): both `Content-Length` and `Transfer-Encoding`, or more than one
/// `Content-Length`. Such a request is never forwarded.
pub fn check_framing(headers: &impl Headers) -> Result<(), RequestError> {
    let lengths = headers.all(&header::CONTENT_LENGTH).count();
    if lengths > 1 {
        return Err(RequestError::AmbiguousFraming(
            "more than one Content-Length",
        ));
    }
    if lengths == 1 && headers.has(&header::TRANSFER_ENCODING) {
        return Err(RequestError::AmbiguousFraming(
            "both Content-Length and Transfer-Encoding",
        ));
    }
    Ok(())
}

/// Removes hop-by-hop headers, including every header the `Connection`
/// header names, except those queuegate sets itself afterwards.
pub fn strip_hop_by_hop(headers: &mut impl Headers) {
    // Most messages carry none, or only `Connection: keep-alive`: one look
    // over the names, noting which hop-by-hop headers are there, instead of
    // a lookup for each of them.
    let mut present = 0u8;
    for name in headers.names() {
        let hop = |h: &&str| h.len() == name.len() && h.as_bytes().eq_ignore_ascii_case(name);
        if let Some(i) = HOP_BY_HOP_NAMES.iter().position(hop) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return;
    }
    // `Connection` is first in HOP_BY_HOP. Mostly it is one word that names
    // no other header (`keep-alive`, `close`, `upgrade`): no need to split.
    if present & 1 != 0
        && !headers.all(&header::CONNECTION).all(|v| {
            let v = v.as_bytes();
            v.eq_ignore_ascii_case(b"keep-alive")
                || v.eq_ignore_ascii_case(b"close")
                || v.eq_ignore_ascii_case(b"upgrade")
        })
    {
        let named: Vec<HeaderName> = headers
            .all(&header::CONNECTION)
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            // `close` names no header; the hop-by-hop ones go below anyway.
            .filter(|token| {
                !token.eq_ignore_ascii_case("close")
                    && !HOP_BY_HOP
                        .iter()
                        .any(|h| token.eq_ignore_ascii_case(h.as_str()))
            })
            .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
            .filter(|name| !protected(name))
            .collect();
        for name in named {
            headers.take_out(&name);
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.take_out(name);
        }
    }
}

/// Headers a client may not remove by naming them in `Connection`.
fn protected(name: &HeaderName) -> bool {
    name == header::HOST
        || name == X_FORWARDED_FOR
        || name == X_FORWARDED_PROTO
        || name == X_FORWARDED_HOST
        || name == X_REAL_IP
        || name == header::FORWARDED
        || name == header::CONTENT_LENGTH
}

/// Whether an HTTP/1.1 request asks to upgrade to WebSocket (among the
/// protocols its `Upgrade` lists). Any other upgrade is not passed on: the
/// request goes to the origin as the plain request it also is.
fn asks_websocket(req: &ClientRequest) -> bool {
    let headers = req.headers();
    if req.version() != Version::HTTP_11 || !headers.contains_key(header::UPGRADE) {
        return false;
    }
    lists(headers, &header::CONNECTION, b"upgrade")
        && lists(headers, &header::UPGRADE, b"websocket")
}

/// Whether an origin's `101` switches to WebSocket.
fn switches_to_websocket<B>(resp: &Answer<B>) -> bool {
    lists(resp.headers(), &header::UPGRADE, b"websocket")
}

/// Whether the comma-separated lists in the `name` headers hold `token`
/// (compared without case).
fn lists(headers: &impl Headers, name: &HeaderName, token: &[u8]) -> bool {
    headers.all(name).any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
    })
}

/// The host the client asked for: the `Host` header, or the HTTP/2 authority.
fn original_host(req: &ClientRequest) -> Option<HeaderValue> {
    if let Some(host) = req.headers().get(header::HOST) {
        return Some(host.clone());
    }
    req.uri()
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
}

/// Appends the client's address to `X-Forwarded-For`, keeping what was there.
fn append_forwarded_for(headers: &mut impl Headers, peer: &Peer) {
    if !headers.has(&X_FORWARDED_FOR) {
        headers.put(X_FORWARDED_FOR.clone(), peer.forwarded_for.clone());
        return;
    }
    let mut value = Vec::new();
    for v in headers.all(&X_FORWARDED_FOR) {
        if v.to_str().is_ok() {
            value.extend_from_slice(v.as_bytes());
            value.extend_from_slice(b", ");
        }
    }
    value.extend_from_slice(peer.forwarded_for.as_bytes());
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
        headers.put(X_FORWARDED_FOR.clone(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    #[test]
    fn connection_named_headers_are_removed_but_not_forwarding_ones() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("x-secret, X-Forwarded-For, keep-alive"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-app", HeaderValue::from_static("kept"));
        strip_hop_by_hop(&mut h);
        assert!(h.get("x-secret").is_none());
        assert!(h.get("keep-alive").is_none());
        assert!(h.get(header::CONNECTION).is_none());
        assert_eq!(h["x-forwarded-for"], "10.0.0.1");
        assert_eq!(h["x-app"], "kept");
    }

    #[test]
    fn hop_by_hop_fields_sent_in_any_case_are_removed() {
        use crate::fields::testing::{names, sent};
        let mut f = sent(&[
            ("CONNECTION", "X-Secret, Keep-Alive"),
            ("x-SECRET", "1"),
            ("Keep-ALIVE", "timeout=5"),
            ("Transfer-ENCODING", "chunked"),
            ("X-App", "kept"),
            ("UPGRADE", "h2c"),
        ]);
        strip_hop_by_hop(&mut f);
        assert_eq!(names(&f), ["X-App=kept"]);
    }

    #[test]
    fn the_hop_by_hop_names_as_text_are_the_same_names() {
        for (name, text) in HOP_BY_HOP.iter().zip(HOP_BY_HOP_NAMES) {
            assert_eq!(name.as_str(), text);
        }
    }

    #[test]
    fn both_lengths_are_ambiguous() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        assert!(check_framing(&h).is_err());
        let mut h = HeaderMap::new();
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        assert!(check_framing(&h).is_err());
    }

    #[test]
    fn forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        h.append("x-forwarded-for", HeaderValue::from_static("2.2.2.2"));
        append_forwarded_for(&mut h, &Peer::new("127.0.0.1:5000".parse().unwrap(), false));
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 127.0.0.1");
    }
}
