//! The RabbitMQ client beneath the publisher (`sink::rabbitmq`): connecting as the
//! configuration says (password, TLS files), classifying the node's replies (the one place
//! that knows its codes), and the progress queues (see `sink::rabbitmq`, "Progress records"):
//! one durable queue per slot key holding the newest record, read back without taking it.

use lapin::options::{BasicGetOptions, BasicRejectOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ErrorKind};

use super::ack::{BrokerError, Refusal};
use crate::config::{BrokerKind, RabbitMqConfig};
use crate::failure::{Class, Failure};
use lapin::protocol::AMQPHardError;
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::uri::AMQPUri;
use lapin::ConnectionProperties;

/// A RabbitMQ failure of `class`.
pub(super) fn err(class: Class, message: impl Into<String>) -> BrokerError {
    BrokerError::new(BrokerKind::RabbitMq, class, message)
}

/// The connection `config` describes (password and TLS files added to the URL).
pub(crate) async fn dial(config: &RabbitMqConfig) -> Result<Connection, BrokerError> {
    let mut uri: AMQPUri = config.url.parse().map_err(|e: String| {
        err(
            Class::Fatal(Failure::Config),
            format!("rabbitmq.url cannot be parsed: {e}"),
        )
    })?;
    if let Some(password) = &config.password {
        uri.authority.userinfo.password = password.expose().to_owned();
    }
    let mut tls = OwnedTLSConfig::default();
    let read = |p: &std::path::Path, what: &str| {
        std::fs::read(p).map_err(|e| {
            err(
                Class::Fatal(Failure::Config),
                format!("{what}: cannot read {}: {e}", p.display()),
            )
        })
    };
    if let Some(ca) = &config.tls_ca_file {
        let pem = read(ca, "rabbitmq.tls_ca_file")?;
        tls.cert_chain = Some(String::from_utf8_lossy(&pem).into_owned());
    }
    if let Some((cert, key)) = &config.tls_client {
        tls.identity = Some(OwnedIdentity::PKCS8 {
            pem: read(cert, "rabbitmq.tls_cert_file")?,
            key: read(key, "rabbitmq.tls_key_file")?,
        });
    }
    let props = ConnectionProperties::default().with_connection_name("walbox".into());
    let runtime = lapin::runtime::default_runtime().map_err(|e| {
        err(
            Class::Fatal(Failure::Kafka),
            format!("no runtime for lapin: {e}"),
        )
    })?;
    Connection::connect_uri_with_config(uri, props, tls, runtime)
        .await
        .map_err(|e| classify_connect(&e, config))
}

/// Where `user` comes from in messages: the URL's user.
fn user(config: &RabbitMqConfig) -> String {
    let rest = config
        .url
        .split_once("://")
        .map(|x| x.1)
        .unwrap_or_default();
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    match authority.rsplit_once('@') {
        Some((user, _)) => user.to_owned(),
        None => "guest".to_owned(),
    }
}

/// The node's address for messages (no user, no password).
fn node(config: &RabbitMqConfig) -> String {
    let rest = config
        .url
        .split_once("://")
        .map(|x| x.1)
        .unwrap_or_default();
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    authority
        .rsplit_once('@')
        .map_or(authority, |x| x.1)
        .to_owned()
}

/// A connect error: refused credentials are [`Failure::Auth`]; a failed TLS handshake (the
/// node's certificate not signed by `rabbitmq.tls_ca_file`'s CA or the system's roots, a name
/// it does not cover, a node without TLS on that port) is [`Failure::Auth`] (exit 4), as
/// PostgreSQL's untrusted certificate and NATS's: a reconnect meets the same certificate, so
/// retrying would loop forever; the rest transient.
fn classify_connect(e: &lapin::Error, config: &RabbitMqConfig) -> BrokerError {
    if let Some(tls) = tls_failure(e) {
        return err(
            Class::Fatal(Failure::Auth),
            format!(
                "the TLS handshake with {} failed ({tls}): check rabbitmq.tls_ca_file (the CA that signed the node's certificate), that the url's host is a name the certificate covers, rabbitmq.tls_cert_file and rabbitmq.tls_key_file, and that the port speaks TLS (amqps://)",
                node(config)
            ),
        );
    }
    if let ErrorKind::ProtocolError(amqp) = e.kind() {
        if matches!(
            amqp.kind(),
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)
        ) || matches!(amqp.kind(), AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED))
        {
            return err(
                Class::Fatal(Failure::Auth),
                format!(
                    "{} refused user {:?} (or its access to the url's virtual host): {}; check the user, rabbitmq.password_file and its permissions",
                    node(config),
                    user(config),
                    amqp.get_message()
                ),
            );
        }
    }
    classify(e, &format!("connecting to {}", node(config)), config)
}

/// OpenSSL's reason, when `e` is a failed TLS handshake (lapin's TLS is OpenSSL's: the
/// handshake's error comes wrapped in an I/O error).
fn tls_failure(e: &lapin::Error) -> Option<String> {
    let ErrorKind::IOError(io) = e.kind() else {
        return None;
    };
    let inner = io.get_ref()?;
    if let Some(ssl) = inner.downcast_ref::<openssl::ssl::Error>() {
        return Some(match ssl.ssl_error() {
            Some(stack) => stack.to_string(),
            None => ssl.to_string(),
        });
    }
    inner
        .downcast_ref::<openssl::error::ErrorStack>()
        .map(ToString::to_string)
}

/// A channel or connection error while `doing`.
pub(crate) fn classify(e: &lapin::Error, doing: &str, config: &RabbitMqConfig) -> BrokerError {
    let ErrorKind::ProtocolError(amqp) = e.kind() else {
        return err(Class::Transient, format!("{doing}: {e}"));
    };
    let text = amqp.get_message().to_string();
    match amqp.kind() {
        AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => err(
            Class::Fatal(Failure::Kafka),
            format!(
                "{doing}: access refused ({text}): grant user {:?} write permission on exchange {:?} (and configure permission on the {}.* queues)",
                user(config),
                config.exchange,
                config.progress_queue
            ),
        )
        .refusing(Refusal::Permission),
        AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => err(
            Class::Fatal(Failure::Kafka),
            format!(
                "{doing}: not found ({text}): declare exchange {:?} (walbox does not create it) or fix rabbitmq.exchange",
                config.exchange
            ),
        ),
        AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) if text.contains("message size") => {
            err(
                Class::Rejected,
                format!("{doing}: {text}: the message is over the node's max_message_size"),
            )
        }
        AMQPErrorKind::Soft(AMQPSoftError::CONTENTTOOLARGE) => err(
            Class::Rejected,
            format!("{doing}: {text}: the message is too large for the node"),
        ),
        _ => err(Class::Transient, format!("{doing}: {e}")),
    }
}

/// The progress queue of slot key `key`: `<progress_queue>.<key>`, every byte outside
/// `[A-Za-z0-9._-]` written as `_`, cut to AMQP's 255 bytes.
pub fn progress_queue(config: &RabbitMqConfig, key: &str) -> String {
    let mut name = format!("{}.", config.progress_queue);
    name.extend(key.chars().map(|c| {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            c
        } else {
            '_'
        }
    }));
    name.truncate(255);
    name
}

/// The progress queue's arguments: it keeps the newest record only.
pub(crate) fn progress_arguments() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString("drop-head".into()),
    );
    args
}

/// The newest progress record of slot key `key`, read from its progress queue and left there;
/// `None` when the queue does not exist or is empty.
pub async fn read_progress(
    config: &RabbitMqConfig,
    key: &str,
) -> Result<Option<Vec<u8>>, BrokerError> {
    let conn = dial(config).await?;
    let result = read_queue(&conn, &progress_queue(config, key), config).await;
    let _ = conn.close(200, "walbox done".into()).await;
    result
}

async fn read_queue(
    conn: &Connection,
    queue: &str,
    config: &RabbitMqConfig,
) -> Result<Option<Vec<u8>>, BrokerError> {
    let doing = format!("reading progress queue {queue:?}");
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| classify(&e, &doing, config))?;
    let declared = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    match declared {
        Ok(_) => {}
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(classify(&e, &doing, config)),
    }
    let got = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: false })
        .await
        .map_err(|e| classify(&e, &doing, config))?;
    let Some(message) = got else {
        return Ok(None);
    };
    let body = message.delivery.data.clone();
    // Back where it was: the record stays for the next reader.
    channel
        .basic_reject(
            message.delivery.delivery_tag,
            BasicRejectOptions { requeue: true },
        )
        .await
        .map_err(|e| classify(&e, &doing, config))?;
    let _ = channel.close(200, "done".into()).await;
    Ok(Some(body))
}

/// Whether `e` is a `NOT_FOUND` channel close.
pub(crate) fn is_not_found(e: &lapin::Error) -> bool {
    matches!(e.kind(), ErrorKind::ProtocolError(a) if matches!(a.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_tls_handshake_stops_walbox_and_an_unreachable_node_is_retried() {
        let config = RabbitMqConfig::for_url("amqps://walbox@localhost:5671/%2f");
        // lapin's OpenSSL handshake error arrives wrapped in an I/O error.
        let handshake: lapin::Error =
            std::io::Error::other(openssl::error::ErrorStack::get()).into();
        let e = classify_connect(&handshake, &config);
        assert_eq!(e.class, Class::Fatal(Failure::Auth), "{}", e.message);
        assert!(e.message.contains("rabbitmq.tls_ca_file"), "{}", e.message);
        let refused: lapin::Error =
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert_eq!(classify_connect(&refused, &config).class, Class::Transient);
    }
}
