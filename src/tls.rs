//! TLS for the public listeners: the rustls server config (ALPN `h2` and
//! `http/1.1`), the certificate and key read from PEM files, and their reload
//! when the files change, without dropping a connection.
//!
//! The handshake itself runs in the connection's task (see `server`); this
//! module only builds the acceptor. Client certificates are not asked for.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use crate::config::TlsFiles;

/// How often the certificate and key files are checked for changes.
pub const RELOAD_CHECK_EVERY: Duration = Duration::from_secs(2);

/// Why a certificate and key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("{cert} and {key}: {reason}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
}

/// The crypto provider queuegate uses everywhere, picked explicitly so that
/// no process-wide default has to be installed.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS listener's acceptor: the server config and the certificate it
/// presents, reloaded from the files when they change.
#[derive(Clone)]
pub struct Acceptor {
    acceptor: tokio_rustls::TlsAcceptor,
    cert: Arc<ReloadingCert>,
}

impl Acceptor {
    /// Loads `files` (an error names the file and the problem) and starts
    /// checking them for changes every [`RELOAD_CHECK_EVERY`] for as long as
    /// the acceptor lives. Must be called inside a tokio runtime.
    pub fn load(files: &TlsFiles) -> Result<Acceptor, TlsError> {
        let provider = provider();
        let (key, stamp) = load_pair(&files.cert, &files.key, &provider)?;
        let cert = Arc::new(ReloadingCert {
            cert_path: files.cert.clone(),
            key_path: files.key.clone(),
            current: ArcSwap::from_pointee(key),
            provider: provider.clone(),
        });
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|err| TlsError::Pair {
                cert: files.cert.clone(),
                key: files.key.clone(),
                reason: err.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(cert.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        tokio::spawn(watch_files(Arc::downgrade(&cert), stamp));
        Ok(Acceptor {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            cert,
        })
    }

    /// The handshake, to run inside the connection's task.
    pub fn accept<IO>(&self, stream: IO) -> tokio_rustls::Accept<IO>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        self.acceptor.accept(stream)
    }

    /// The certificate chain new handshakes present (leaf first).
    pub fn current_chain(&self) -> Vec<CertificateDer<'static>> {
        self.cert.current.load().cert.clone()
    }
}

/// The certificate new handshakes get; swapped whole on reload.
#[derive(Debug)]
struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: ArcSwap<CertifiedKey>,
    provider: Arc<CryptoProvider>,
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// What the files looked like when last read: modification time and size of
/// the certificate and the key (symlinks followed, as a Kubernetes secret
/// volume swaps them).
type Stamp = [(Option<SystemTime>, u64); 2];

fn stamp_of(cert: &Path, key: &Path) -> Stamp {
    let one = |p: &Path| match std::fs::metadata(p) {
        Ok(m) => (m.modified().ok(), m.len()),
        Err(_) => (None, 0),
    };
    [one(cert), one(key)]
}

async fn watch_files(cert: Weak<ReloadingCert>, mut seen: Stamp) {
    let mut every = tokio::time::interval(RELOAD_CHECK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        let Some(cert) = cert.upgrade() else {
            return;
        };
        let (cert_path, key_path) = (cert.cert_path.clone(), cert.key_path.clone());
        let stamp = match tokio::task::spawn_blocking(move || stamp_of(&cert_path, &key_path)).await
        {
            Ok(stamp) => stamp,
            Err(_) => continue,
        };
        if stamp == seen {
            continue;
        }
        // Remembered even when the new files are bad, so a bad file is logged
        // once; writing the other half of the pair changes the stamp again.
        seen = stamp;
        let reloading = cert.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            load_pair(
                &reloading.cert_path,
                &reloading.key_path,
                &reloading.provider,
            )
        })
        .await;
        match loaded {
            Ok(Ok((key, _))) => {
                cert.current.store(Arc::new(key));
                tracing::info!(cert = %cert.cert_path.display(), "TLS certificate reloaded");
            }
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "TLS certificate not reloaded: keeping the current one");
            }
            Err(err) => {
                tracing::warn!(error = %err, "TLS certificate reload did not finish");
            }
        }
    }
}

/// Reads and checks a certificate chain and its private key.
fn load_pair(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<(CertifiedKey, Stamp), TlsError> {
    let stamp = stamp_of(cert_path, key_path);
    let file_err = |path: &Path, reason: String| TlsError::File {
        path: path.to_owned(),
        reason,
    };
    let chain = CertificateDer::pem_file_iter(cert_path)
        .map_err(|err| file_err(cert_path, err.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| file_err(cert_path, err.to_string()))?;
    if chain.is_empty() {
        return Err(file_err(cert_path, "no PEM certificate found".into()));
    }
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|err| file_err(key_path, format!("no usable PEM private key: {err}")))?;
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(|err| TlsError::Pair {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        reason: err.to_string(),
    })?;
    Ok((certified, stamp))
}
