//! TLS for the public listeners: the rustls server config (ALPN `h2` and
//! `http/1.1`), the certificate and key read from PEM files, and their reload
//! without dropping a connection: when the files change (watched through
//! their directories, see `file_watch`) and on `SIGHUP`, for file systems
//! whose changes are not reported.
//!
//! The handshake itself runs in the connection's task (see `server`); this
//! module only builds the acceptor. Client certificates are not asked for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::sync::mpsc;

use crate::config::TlsFiles;
use crate::file_watch::{self, FileWatch};

/// Why a certificate and key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file cannot be read or is not PEM.
    #[error("{path}: {source}")]
    Certificate {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("{path}: no PEM certificate found")]
    NoCertificate { path: PathBuf },
    /// The key file cannot be read or holds no PEM private key.
    #[error("{path}: no usable PEM private key: {source}")]
    Key {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    /// rustls refuses the pair: the key does not match the certificate, or
    /// is of an unsupported kind.
    #[error("{cert} and {key}: {source}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
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
    /// Keeps the reload going while any clone of the acceptor lives.
    _reloading: Arc<Reloading>,
}

/// The file watch and the reload task's channel: dropping it closes the
/// channel, which ends the task.
struct Reloading {
    _watch: Option<FileWatch>,
    _changes: mpsc::Sender<()>,
}

impl Acceptor {
    /// Loads `files` (an error names the file and the problem) and reloads
    /// them when they change, for as long as the acceptor lives. Must be
    /// called inside a tokio runtime.
    pub fn load(files: &TlsFiles) -> Result<Acceptor, TlsError> {
        let provider = provider();
        let cert = Arc::new(ReloadingCert::load(files, provider.clone())?);
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Pair {
                cert: files.cert.clone(),
                key: files.key.clone(),
                source,
            })?
            .with_no_client_auth()
            .with_cert_resolver(cert.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];

        // One pending reload is enough: it reads whatever the files hold then.
        let (changes, changed) = mpsc::channel(1);
        let notice = changes.clone();
        let watch = match FileWatch::start(&[&files.cert, &files.key], move || {
            let _ = notice.try_send(());
        }) {
            Ok(watch) => Some(watch),
            Err(err) => {
                tracing::warn!(
                    cert = %files.cert.display(),
                    error = %err,
                    "cannot watch the TLS certificate files: reload them with SIGHUP"
                );
                None
            }
        };
        // Checked once now the watch is on, so a change made between loading
        // the files and starting the watch is not missed.
        let _ = changes.try_send(());
        tokio::spawn(reload_on_change(cert, changed));
        Ok(Acceptor {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            _reloading: Arc::new(Reloading {
                _watch: watch,
                _changes: changes,
            }),
        })
    }

    /// The handshake, to run inside the connection's task.
    pub fn accept<IO>(&self, stream: IO) -> tokio_rustls::Accept<IO>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        self.acceptor.accept(stream)
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

impl ReloadingCert {
    fn load(files: &TlsFiles, provider: Arc<CryptoProvider>) -> Result<ReloadingCert, TlsError> {
        let key = load_pair(&files.cert, &files.key, &provider)?;
        Ok(ReloadingCert {
            cert_path: files.cert.clone(),
            key_path: files.key.clone(),
            current: ArcSwap::from_pointee(key),
            provider,
        })
    }

    /// Reads the files again and presents what they hold to new
    /// handshakes. Answers whether the certificate changed; on an error the
    /// current one stays.
    fn reload(&self) -> Result<bool, TlsError> {
        let key = load_pair(&self.cert_path, &self.key_path, &self.provider)?;
        // The pair was checked to match, so the same chain means the same
        // certificate: an event that changed nothing is not a reload.
        if key.cert == self.current.load().cert {
            return Ok(false);
        }
        self.current.store(Arc::new(key));
        Ok(true)
    }
}

/// Reloads `cert` after each reported change (once the writes settle) and
/// on `SIGHUP`, until the channel closes with the last acceptor.
async fn reload_on_change(cert: Arc<ReloadingCert>, mut changed: mpsc::Receiver<()>) {
    let mut hangup = Hangup::new();
    loop {
        tokio::select! {
            got = changed.recv() => {
                if got.is_none() {
                    return;
                }
                tokio::time::sleep(file_watch::SETTLE).await;
                // Changes reported while settling are read by this reload.
                while changed.try_recv().is_ok() {}
            }
            () = hangup.recv() => {}
        }
        let reloading = cert.clone();
        match tokio::task::spawn_blocking(move || reloading.reload()).await {
            Ok(Ok(true)) => {
                tracing::info!(cert = %cert.cert_path.display(), "TLS certificate reloaded");
            }
            Ok(Ok(false)) => {
                tracing::debug!(cert = %cert.cert_path.display(), "TLS certificate unchanged");
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

/// `SIGHUP`, where there is one.
struct Hangup {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangup {
    fn new() -> Hangup {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let signal = match signal(SignalKind::hangup()) {
                Ok(signal) => Some(signal),
                Err(err) => {
                    tracing::warn!(error = %err, "SIGHUP will not reload the TLS certificate");
                    None
                }
            };
            Hangup { signal }
        }
        #[cfg(not(unix))]
        Hangup {}
    }

    /// The next `SIGHUP`; never, without one.
    async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some(signal) = &mut self.signal {
            if signal.recv().await.is_some() {
                return;
            }
            self.signal = None;
        }
        std::future::pending::<()>().await
    }
}

/// Reads and checks a certificate chain and its private key.
fn load_pair(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let unreadable = |source| TlsError::Certificate {
        path: cert_path.to_owned(),
        source,
    };
    let chain = CertificateDer::pem_file_iter(cert_path)
        .map_err(unreadable)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(unreadable)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|source| TlsError::Key {
        path: key_path.to_owned(),
        source,
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|source| TlsError::Pair {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `name`: its PEM, its key's PEM and its DER.
    fn self_signed(name: &str) -> (String, String, CertificateDer<'static>) {
        let made = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        (
            made.cert.pem(),
            made.signing_key.serialize_pem(),
            made.cert.der().clone(),
        )
    }

    fn write(dir: &Path, cert_pem: &str, key_pem: &str) -> TlsFiles {
        let files = TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        std::fs::write(&files.cert, cert_pem).unwrap();
        std::fs::write(&files.key, key_pem).unwrap();
        files
    }

    fn presented(cert: &ReloadingCert) -> CertificateDer<'static> {
        cert.current.load().cert[0].clone()
    }

    #[test]
    fn a_new_pair_replaces_the_certificate_and_unchanged_files_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let (cert_one, key_one, der_one) = self_signed("one.test");
        let files = write(dir.path(), &cert_one, &key_one);
        let cert = ReloadingCert::load(&files, provider()).unwrap();
        assert_eq!(presented(&cert), der_one);
        assert!(!cert.reload().unwrap(), "same files, same certificate");

        let (cert_two, key_two, der_two) = self_signed("two.test");
        write(dir.path(), &cert_two, &key_two);
        assert!(cert.reload().unwrap());
        assert_eq!(presented(&cert), der_two);
        assert!(!cert.reload().unwrap());
    }

    #[test]
    fn bad_files_are_refused_and_the_current_certificate_stays() {
        let dir = tempfile::tempdir().unwrap();
        let (cert_one, key_one, der_one) = self_signed("one.test");
        let files = write(dir.path(), &cert_one, &key_one);
        let cert = ReloadingCert::load(&files, provider()).unwrap();

        std::fs::write(&files.cert, "not a certificate").unwrap();
        let err = cert.reload().unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err:?}");
        assert_eq!(presented(&cert), der_one);

        // Half of a new pair: the key no longer matches the certificate.
        let (cert_two, _, _) = self_signed("two.test");
        std::fs::write(&files.cert, &cert_two).unwrap();
        let err = cert.reload().unwrap_err();
        let TlsError::Pair { source, .. } = &err else {
            panic!("expected a refused pair, got {err:?}");
        };
        assert!(err.to_string().ends_with(&source.to_string()), "{err}");
        assert_eq!(presented(&cert), der_one);
    }

    #[test]
    fn a_missing_file_is_named_with_the_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            cert: dir.path().join("missing.crt"),
            key: dir.path().join("missing.key"),
        };
        let err = ReloadingCert::load(&files, provider()).unwrap_err();
        let TlsError::Certificate { path, source } = &err else {
            panic!("expected an unreadable certificate, got {err:?}");
        };
        assert_eq!(path, &files.cert);
        assert!(matches!(source, pem::Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound));
        assert!(err.to_string().contains("missing.crt"), "{err}");
    }
}
