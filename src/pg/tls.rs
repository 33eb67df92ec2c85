//! TLS to PostgreSQL with OpenSSL, shared by the replication and the control connection.
//!
//! One TLS stack: rdkafka already links OpenSSL, so walbox uses it for PostgreSQL too
//! (`tokio-openssl` for the replication connection, `postgres-openssl` for tokio-postgres).
//!
//! What each [`SslMode`] checks (libpq's semantics):
//!
//! | mode | encrypts | verifies chain | verifies host name |
//! |---|---|---|---|
//! | `disable` | no | – | – |
//! | `prefer` | if the server agrees | only if `sslrootcert` is given | no |
//! | `require` | yes | only if `sslrootcert` is given | no |
//! | `verify-ca` | yes | yes | no |
//! | `verify-full` | yes | yes | yes (DNS name or IP address SAN / CN) |
//!
//! The chain is verified against the PEM certificates in `sslrootcert` only, or against the system
//! roots when `sslrootcert` is absent or `system`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::ssl::{ConnectConfiguration, SslConnector, SslMethod, SslRef, SslVerifyMode};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::{X509VerifyResult, X509};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_openssl::SslStream;

use crate::config::conninfo::SslMode;
use crate::failure::{Classify, Failure};

/// TLS could not be set up or negotiated.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// OpenSSL refused the configuration.
    #[error("cannot set up TLS: {0}")]
    Setup(#[from] ErrorStack),
    /// `sslrootcert` could not be read or holds no PEM certificate.
    #[error("cannot use sslrootcert {}: {reason}", path.display())]
    RootCert {
        /// The file.
        path: PathBuf,
        /// The I/O or parse error, as text.
        reason: String,
    },
    /// The handshake failed for another reason than the certificate (e.g. the connection
    /// dropped): may succeed on retry.
    #[error("TLS handshake failed: {0}")]
    Handshake(String),
    /// The server's certificate was rejected: untrusted, expired, or a host name mismatch.
    /// Retrying cannot help.
    #[error("TLS handshake failed: the server certificate was rejected: {0}")]
    CertificateRejected(String),
    /// The server answered the SSLRequest with 'N' and the mode does not allow plaintext.
    /// Retrying cannot help.
    #[error("the server does not support TLS, and sslmode={0} requires it: enable ssl on the server, or lower sslmode in postgres.url (prefer or disable) if plaintext is acceptable")]
    NotSupported(SslMode),
}

impl TlsError {
    /// Whether retrying the connection could succeed (only an interrupted handshake).
    pub fn is_transient(&self) -> bool {
        matches!(self, TlsError::Handshake(_))
    }
}

impl Classify for TlsError {
    /// An interrupted handshake is transient; anything else (certificate, `sslrootcert`, a
    /// server without TLS under `require`) is a configuration problem every retry repeats.
    fn failure(&self) -> Option<Failure> {
        (!self.is_transient()).then_some(Failure::Auth)
    }
}

/// A ready-to-use TLS client configuration for one [`SslMode`].
#[derive(Clone)]
pub struct TlsConfig {
    connector: SslConnector,
    verify_peer: bool,
    verify_hostname: bool,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("verify_peer", &self.verify_peer)
            .field("verify_hostname", &self.verify_hostname)
            .finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// Builds the configuration for `mode`; `None` for [`SslMode::Disable`]. `root_cert` is
    /// `sslrootcert`.
    pub fn new(mode: SslMode, root_cert: Option<&Path>) -> Result<Option<TlsConfig>, TlsError> {
        let (verify_peer, verify_hostname) = match mode {
            SslMode::Disable => return Ok(None),
            SslMode::Prefer | SslMode::Require => (root_cert.is_some(), false),
            SslMode::VerifyCa => (true, false),
            SslMode::VerifyFull => (true, true),
        };
        let mut builder = SslConnector::builder(SslMethod::tls_client())?;
        if verify_peer {
            builder.set_verify(SslVerifyMode::PEER);
            if let Some(path) = root_cert.filter(|p| *p != Path::new("system")) {
                let pem = std::fs::read(path).map_err(|e| TlsError::RootCert {
                    path: path.to_owned(),
                    reason: e.to_string(),
                })?;
                let certs = X509::stack_from_pem(&pem).map_err(|e| TlsError::RootCert {
                    path: path.to_owned(),
                    reason: e.to_string(),
                })?;
                if certs.is_empty() {
                    return Err(TlsError::RootCert {
                        path: path.to_owned(),
                        reason: "no PEM certificate in the file".to_owned(),
                    });
                }
                let mut store = X509StoreBuilder::new()?;
                for cert in certs {
                    store.add_cert(cert)?;
                }
                // Only the given roots, not the system's (like libpq).
                builder.set_cert_store(store.build());
            }
        } else {
            builder.set_verify(SslVerifyMode::NONE);
        }
        Ok(Some(TlsConfig {
            connector: builder.build(),
            verify_peer,
            verify_hostname,
        }))
    }

    /// Whether the server's certificate chain is verified.
    pub fn verifies_peer(&self) -> bool {
        self.verify_peer
    }

    /// Whether the certificate must match the host name.
    pub fn verifies_hostname(&self) -> bool {
        self.verify_hostname
    }

    /// A per-connection configuration (call `into_ssl(host)` on it).
    pub fn configure(&self) -> Result<ConnectConfiguration, TlsError> {
        let mut config = self.connector.configure()?;
        config.set_verify_hostname(self.verify_hostname);
        Ok(config)
    }

    /// Runs the TLS handshake on `stream` (after the server accepted the SSLRequest). `host` is
    /// used for SNI and, with `verify-full`, checked against the certificate.
    pub async fn handshake<S>(&self, host: &str, stream: S) -> Result<SslStream<S>, TlsError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let ssl = self.configure()?.into_ssl(host)?;
        let mut stream = SslStream::new(ssl, stream)?;
        if let Err(e) = Pin::new(&mut stream).connect().await {
            let verify = stream.ssl().verify_result();
            return Err(if verify == X509VerifyResult::OK {
                TlsError::Handshake(e.to_string())
            } else {
                TlsError::CertificateRejected(format!("{e}: {verify}"))
            });
        }
        Ok(stream)
    }

    /// The same configuration as a tokio-postgres TLS connector, for the control connection.
    pub fn make_tls_connect(&self) -> postgres_openssl::MakeTlsConnector {
        let mut make = postgres_openssl::MakeTlsConnector::new(self.connector.clone());
        let verify_hostname = self.verify_hostname;
        make.set_callback(move |config, _host| {
            config.set_verify_hostname(verify_hostname);
            Ok(())
        });
        make
    }
}

/// The `tls-server-end-point` channel binding data of a TLS session (RFC 5929): the hash of the
/// server's certificate with its signature's digest, SHA-256 for MD5 and SHA-1. `None` when it
/// cannot be computed (then SCRAM runs without channel binding).
pub fn tls_server_end_point(ssl: &SslRef) -> Option<Vec<u8>> {
    let cert = ssl.peer_certificate()?;
    let algorithms = cert
        .signature_algorithm()
        .object()
        .nid()
        .signature_algorithms()?;
    let digest = match algorithms.digest {
        Nid::MD5 | Nid::SHA1 => MessageDigest::sha256(),
        nid => MessageDigest::from_nid(nid)?,
    };
    cert.digest(digest).ok().map(|d| d.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert!(TlsConfig::new(SslMode::Disable, None).unwrap().is_none());
        let prefer = TlsConfig::new(SslMode::Prefer, None).unwrap().unwrap();
        assert!(!prefer.verifies_peer() && !prefer.verifies_hostname());
        let require = TlsConfig::new(SslMode::Require, None).unwrap().unwrap();
        assert!(!require.verifies_peer());
        let ca = TlsConfig::new(SslMode::VerifyCa, None).unwrap().unwrap();
        assert!(ca.verifies_peer() && !ca.verifies_hostname());
        let full = TlsConfig::new(SslMode::VerifyFull, Some(Path::new("system")))
            .unwrap()
            .unwrap();
        assert!(full.verifies_peer() && full.verifies_hostname());
    }

    #[test]
    fn bad_root_cert() {
        let e = TlsConfig::new(SslMode::VerifyFull, Some(Path::new("/nonexistent/ca.pem")))
            .unwrap_err();
        assert!(matches!(e, TlsError::RootCert { .. }), "{e}");
        let empty = std::env::temp_dir().join(format!("walbox-empty-{}.pem", std::process::id()));
        std::fs::write(&empty, b"not a certificate").unwrap();
        let e = TlsConfig::new(SslMode::VerifyCa, Some(&empty)).unwrap_err();
        std::fs::remove_file(&empty).ok();
        assert!(matches!(e, TlsError::RootCert { .. }), "{e}");
    }
}
