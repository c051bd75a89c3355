//! TLS on real sockets: a listener with a certificate from a test CA made at
//! test time (HTTP/2 by ALPN, `__Host-` cookies with `Secure`), certificate
//! reload without dropping connections, and an https origin behind a private
//! CA (`upstream.ca_file`).

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use queuegate::config::{Config, TlsFiles};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A test CA that signs server certificates.
struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A server certificate and its key, as PEM.
struct Leaf {
    cert_pem: String,
    key_pem: String,
    der: CertificateDer<'static>,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        TestCa { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn root_store(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.issuer.der().clone()).unwrap();
        roots
    }

    /// A certificate for `localhost` and 127.0.0.1.
    fn leaf(&self, cn: &str) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }
}

/// Writes `leaf` to `dir` as tls.crt / tls.key (each replaced atomically).
fn install(dir: &Path, leaf: &Leaf) -> TlsFiles {
    let files = TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    for (path, text) in [(&files.cert, &leaf.cert_pem), (&files.key, &leaf.key_pem)] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
    files
}

fn client_tls(ca: &TestCa, alpn: &[&[u8]]) -> rustls::ClientConfig {
    let mut config = rustls::ClientConfig::builder_with_provider(queuegate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(ca.root_store())
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// queuegate on one TLS listener.
struct TlsGate {
    addr: SocketAddr,
    _shutdown: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Drop for TlsGate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn spawn_tls_gate(mut config: Config, files: TlsFiles) -> TlsGate {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    config.listen[0].tls = Some(files.clone());
    let acceptor = queuegate::tls::Acceptor::load(&files).unwrap();
    let listeners = queuegate::Listeners {
        public: vec![queuegate::PublicListener {
            listener,
            tls: Some(acceptor),
        }],
        admin: None,
    };
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(queuegate::run_with(
        config,
        ring("k1"),
        listeners,
        async move {
            let _ = rx.await;
        },
    ));
    TlsGate {
        addr,
        _shutdown: tx,
        task,
    }
}

/// A new TLS connection to `addr`; returns the stream and the leaf
/// certificate the server presented.
async fn connect(
    addr: SocketAddr,
    ca: &TestCa,
    alpn: &[&[u8]],
) -> (
    tokio_rustls::client::TlsStream<TcpStream>,
    CertificateDer<'static>,
) {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_tls(ca, alpn)));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let stream = connector.connect(name, tcp).await.unwrap();
    let leaf = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
    (stream, leaf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listener_speaks_h2_and_names_cookies_for_tls() {
    let ca = TestCa::new("queuegate test CA");
    let dir = tempfile::tempdir().unwrap();
    let files = install(dir.path(), &ca.leaf("first"));
    let (origin, _hits) = counting_origin().await;
    let mut config = proxy_config(&origin.url());
    config.routes = vec![route("tickets", "/tickets", 10)];
    let gate = spawn_tls_gate(config, files).await;

    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_tls(&ca, &[]))
        .https_only()
        .enable_all_versions()
        .build();
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(https);
    let url = format!("https://localhost:{}/tickets/a", gate.addr.port());
    let req = Request::get(&url)
        .header("accept", "text/html")
        .header("sec-fetch-mode", "navigate")
        .body(Empty::new())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.version(), Version::HTTP_2, "ALPN chose h2");
    assert_eq!(resp.status(), StatusCode::OK);
    let set_cookie = resp
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"origin /tickets/a");
    assert!(set_cookie.starts_with("__Host-qg_tickets="), "{set_cookie}");
    assert!(set_cookie.contains("; Secure"), "{set_cookie}");
    assert!(set_cookie.contains("Path=/"), "{set_cookie}");
    assert!(!set_cookie.contains("Domain="), "{set_cookie}");

    // The pass works on the next request; the origin never sees it.
    let pass = set_cookie.split(';').next().unwrap().to_owned();
    let req = Request::get(&url)
        .header("cookie", &pass)
        .body(Empty::new())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-origin-cookies"], "");
    // That first return confirmed the session: the confirmed pass comes
    // with the same TLS cookie name and attributes, and is used as is.
    let confirmed = resp
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        confirmed.starts_with("__Host-qg_tickets=v1.a."),
        "{confirmed}"
    );
    assert!(confirmed.contains("; Secure"), "{confirmed}");
    let pass = confirmed.split(';').next().unwrap().to_owned();
    let req = Request::get(&url)
        .header("cookie", &pass)
        .body(Empty::new())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().get("set-cookie").is_none());
    assert_eq!(resp.headers()["x-origin-cookies"], "");

    // HTTP/1.1 by ALPN works too, and the origin is told the scheme.
    let (stream, _) = connect(gate.addr, &ca, &[b"http/1.1"]).await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/elsewhere")
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_certificate_files_are_served_to_new_handshakes_only() {
    let ca = TestCa::new("queuegate test CA");
    let dir = tempfile::tempdir().unwrap();
    let first = ca.leaf("first");
    let files = install(dir.path(), &first);
    let (origin, _hits) = counting_origin().await;
    let gate = spawn_tls_gate(proxy_config(&origin.url()), files).await;

    let (stream, presented) = connect(gate.addr, &ca, &[b"h2"]).await;
    assert_eq!(presented, first.der);
    let (mut open, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let get = |path: &str| {
        Request::get(format!("https://localhost{path}"))
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let resp = open.send_request(get("/before")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);

    // A broken file is refused: handshakes go on with the current
    // certificate (src/tls.rs tests each refusal on its own).
    std::fs::write(dir.path().join("tls.crt"), "not a certificate").unwrap();
    let (_, presented) = connect(gate.addr, &ca, &[b"h2"]).await;
    assert_eq!(
        presented, first.der,
        "a bad file does not replace the certificate"
    );

    // A new pair, each file renamed into place: new handshakes present the
    // first certificate until the change is noticed, then the second.
    let second = ca.leaf("second");
    install(dir.path(), &second);
    let mut reloaded = false;
    for _ in 0..200 {
        let (_, presented) = connect(gate.addr, &ca, &[b"h2"]).await;
        if presented == second.der {
            reloaded = true;
            break;
        }
        assert_eq!(presented, first.der, "only the first or the second");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reloaded, "new handshakes present the new certificate");

    // The connection made before the reload still works.
    let resp = open.send_request(get("/after")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"origin /after");
}

/// An https origin with a certificate from `ca`; answers with the path and
/// the `X-Forwarded-Proto` it was given.
async fn spawn_tls_origin(ca: &TestCa) -> (SocketAddr, JoinHandle<()>) {
    let leaf = ca.leaf("origin");
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(queuegate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der.clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(|req: Request<hyper::body::Incoming>| async move {
                    let proto = req
                        .headers()
                        .get("x-forwarded-proto")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned();
                    Ok::<_, Infallible>(http::Response::new(full(format!(
                        "tls origin {} {proto}",
                        req.uri()
                    ))))
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstream_is_trusted_through_its_private_ca_file() {
    let origin_ca = TestCa::new("origin private CA");
    let (origin_addr, origin_task) = spawn_tls_origin(&origin_ca).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file: PathBuf = dir.path().join("origin-ca.pem");
    std::fs::write(&ca_file, origin_ca.pem()).unwrap();
    let upstream = format!("https://localhost:{}", origin_addr.port());

    let mut config = proxy_config(&upstream);
    config.upstream.ca_file = Some(ca_file);
    let gate = spawn_gate(config).await;
    let (parts, body) = get(&gate.url("/page?q=1")).await;
    assert_eq!(parts.status, StatusCode::OK, "{body:?}");
    assert_eq!(&body[..], b"tls origin /page?q=1 http");

    // Without the private CA the origin's certificate is not trusted.
    let untrusted = spawn_gate(proxy_config(&upstream)).await;
    let (parts, _) = get(&untrusted.url("/page")).await;
    assert_eq!(parts.status, StatusCode::BAD_GATEWAY);
    assert!(parts.headers.contains_key("x-queuegate"));
    origin_task.abort();
}
