//! Alert webhook: POSTs each slot alert transition as JSON, in the background.
//!
//! Delivery never blocks replication: [`Webhook::notify`] only enqueues (a bounded queue; when
//! it is full the notification is dropped with a warning), and a separate task sends each
//! payload with up to `webhook_attempts` tries, exponential backoff between them and a timeout
//! per try. A 2xx answer is success. `http://` and `https://` URLs are supported (TLS through
//! OpenSSL, verified against the system's roots). Written on hyper's client connection API
//! rather than a full HTTP client crate: one POST to one URL needs no pool, redirects or
//! cookies, and it keeps the binary on one TLS stack.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::backoff::Backoff;
use crate::config::secret::Secret;
use crate::config::AlertsConfig;
use crate::failure::{Classify, Failure};

/// Why one delivery attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The URL is not `http(s)://host[:port][/path]` (the URL itself is never quoted).
    #[error("invalid webhook URL: {0}")]
    Url(&'static str),
    /// Connecting or talking to the receiver failed.
    #[error("webhook request failed: {0}")]
    Io(#[from] std::io::Error),
    /// TLS set-up or handshake failed.
    #[error("webhook TLS: {0}")]
    Tls(String),
    /// HTTP protocol error.
    #[error("webhook HTTP: {0}")]
    Http(#[from] hyper::Error),
    /// The receiver answered with a non-2xx status.
    #[error("webhook answered HTTP {0}")]
    Status(u16),
    /// The attempt timed out.
    #[error("webhook timed out")]
    Timeout,
}

impl Classify for WebhookError {
    /// An unusable URL is the configuration's (exit 3); a receiver that fails or answers
    /// non-2xx is retried, and never stops walbox.
    fn failure(&self) -> Option<Failure> {
        match self {
            WebhookError::Url(_) => Some(Failure::Config),
            WebhookError::Io(_)
            | WebhookError::Tls(_)
            | WebhookError::Http(_)
            | WebhookError::Status(_)
            | WebhookError::Timeout => None,
        }
    }
}

/// A parsed webhook URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookUrl {
    tls: bool,
    host: String,
    port: u16,
    path: String,
    /// `alerts.webhook_token`, sent as `Authorization: Bearer <token>`.
    token: Option<Secret>,
}

impl WebhookUrl {
    /// Parses `http(s)://host[:port][/path][?query]` with [`http::Uri`]. The error never
    /// quotes the URL: webhook URLs often carry a token.
    pub fn parse(url: &str) -> Result<Self, WebhookError> {
        let uri: http::Uri = url
            .parse()
            .map_err(|_| WebhookError::Url("not an http(s)://host[:port][/path] URL"))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(WebhookError::Url("the scheme must be http or https")),
        };
        let authority = uri
            .authority()
            .ok_or(WebhookError::Url("the URL has no host"))?;
        if authority.as_str().contains('@') {
            return Err(WebhookError::Url(
                "credentials in the URL are not supported",
            ));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(WebhookError::Url("the URL has no host"));
        }
        let port = match authority.port() {
            Some(p) => p.as_u16(),
            // Something after the host that is not a port number ("h:", "h:port").
            None if authority.as_str() != authority.host() => {
                return Err(WebhookError::Url("the port is not a number"))
            }
            None => {
                if tls {
                    443
                } else {
                    80
                }
            }
        };
        let path = uri
            .path_and_query()
            .map(|p| p.as_str())
            .filter(|p| !p.is_empty())
            .unwrap_or("/");
        Ok(WebhookUrl {
            tls,
            host: host.to_owned(),
            port,
            path: path.to_owned(),
            token: None,
        })
    }
}

/// POSTs `body` once.
pub async fn post(url: &WebhookUrl, body: Bytes) -> Result<(), WebhookError> {
    let tcp = TcpStream::connect((url.host.as_str(), url.port)).await?;
    if url.tls {
        let connector = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls())
            .map_err(|e| WebhookError::Tls(e.to_string()))?
            .build();
        let ssl = connector
            .configure()
            .and_then(|c| c.into_ssl(&url.host))
            .map_err(|e| WebhookError::Tls(e.to_string()))?;
        let mut stream = tokio_openssl::SslStream::new(ssl, tcp)
            .map_err(|e| WebhookError::Tls(e.to_string()))?;
        std::pin::Pin::new(&mut stream)
            .connect()
            .await
            .map_err(|e| WebhookError::Tls(e.to_string()))?;
        send(stream, url, body).await
    } else {
        send(tcp, url, body).await
    }
}

async fn send<S>(stream: S, url: &WebhookUrl, body: Bytes) -> Result<(), WebhookError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let host = if (url.tls && url.port == 443) || (!url.tls && url.port == 80) {
        url.host.clone()
    } else {
        format!("{}:{}", url.host, url.port)
    };
    let mut req = Request::post(url.path.as_str())
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::USER_AGENT, "walbox");
    if let Some(token) = &url.token {
        req = req.header(
            hyper::header::AUTHORIZATION,
            format!("Bearer {}", token.expose()),
        );
    }
    let req = req
        .body(Full::new(body))
        .map_err(|_| WebhookError::Url("the path is not a valid request target"))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(WebhookError::Status(status))
    }
}

/// The background sender; cheap to clone. The task ends once every clone is dropped and the
/// queue is delivered.
#[derive(Clone)]
pub struct Webhook {
    queue: mpsc::Sender<serde_json::Value>,
    done: watch::Receiver<bool>,
}

impl Webhook {
    /// Starts the sender task for `config.webhook_url` (`Ok(None)` when no URL is set).
    pub fn start(config: &AlertsConfig) -> Result<Option<Webhook>, WebhookError> {
        let Some(raw) = &config.webhook_url else {
            return Ok(None);
        };
        let mut url = WebhookUrl::parse(raw)?;
        url.token = config.webhook_token.clone();
        let (queue, mut rx) = mpsc::channel::<serde_json::Value>(64);
        let (done_tx, done) = watch::channel(false);
        let attempts = config.webhook_attempts;
        let timeout = config.webhook_timeout;
        tokio::spawn(async move {
            while let Some(payload) = rx.recv().await {
                let body = Bytes::from(payload.to_string());
                let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
                for attempt in 1..=attempts {
                    let result = match tokio::time::timeout(timeout, post(&url, body.clone())).await
                    {
                        Ok(r) => r,
                        Err(_) => Err(WebhookError::Timeout),
                    };
                    match result {
                        Ok(()) => break,
                        Err(e) if attempt == attempts => {
                            tracing::error!(error = %e, attempts, "alert webhook delivery failed; giving up on this notification");
                        }
                        Err(e) => {
                            let delay = backoff.next_delay();
                            tracing::warn!(error = %e, attempt, retry_in = ?delay, "alert webhook delivery failed; retrying");
                            tokio::time::sleep(delay).await;
                        }
                    }
                }
            }
            let _ = done_tx.send(true);
        });
        Ok(Some(Webhook { queue, done }))
    }

    /// Completes when the sender task has delivered everything and ended (after every clone of
    /// this handle is dropped).
    pub fn finished(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut done = self.done.clone();
        async move {
            let _ = done.wait_for(|d| *d).await;
        }
    }

    /// Enqueues a payload; never waits.
    pub fn notify(&self, payload: serde_json::Value) {
        if self.queue.try_send(payload).is_err() {
            tracing::warn!("alert webhook queue is full; notification dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = WebhookUrl::parse("http://am.local:9093/api/hook").unwrap();
        assert_eq!(
            (u.tls, u.host.as_str(), u.port, u.path.as_str()),
            (false, "am.local", 9093, "/api/hook")
        );
        let u = WebhookUrl::parse("https://hooks.example.com").unwrap();
        assert_eq!((u.tls, u.port, u.path.as_str()), (true, 443, "/"));
        let u = WebhookUrl::parse("http://[::1]:8080/x").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 8080));
        assert!(WebhookUrl::parse("ftp://x").is_err());
        assert!(WebhookUrl::parse("http://:80/").is_err());
        assert!(WebhookUrl::parse("http://h:port/").is_err());
        let u = WebhookUrl::parse("https://hooks.example.com/T0/hunter2?token=s3cret").unwrap();
        assert_eq!(u.path, "/T0/hunter2?token=s3cret");
        for bad in ["https://user:s3cret@h/x", "h/s3cret", "https://h:/s3cret"] {
            let e = WebhookUrl::parse(bad).unwrap_err().to_string();
            assert!(!e.contains("s3cret"), "the URL is never quoted: {e}");
        }
    }
}
