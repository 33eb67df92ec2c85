//! The RabbitMQ checks of `walbox check`: the node answers, it accepts the credentials, the
//! exchange exists, the user may publish to it, and the progress queues can be declared,
//! written and read.
//!
//! The connection is made exactly like the publisher's (`sink::rabbitmq::dial`: the URL, the
//! password, the TLS files). The exchange is declared passively (never created). Publishing is
//! proven by publishing: a mandatory, persistent-less probe (empty body, type `walbox.check`,
//! header `walbox.check`, `expiration = 0`) with the routing key `walbox.check.<pid>`, which
//! nothing binds on a direct or topic exchange, so it is returned: permitted. A refusal
//! (`ACCESS_REFUSED`) fails the check with the permission to grant. On an exchange that routes
//! every key (`x-consistent-hash`, fanout) the probe reaches a queue, where it expires at once
//! unless a consumer is waiting; the check says so. The progress queues are checked on a queue
//! of their name pattern (`<progress_queue>.check-<pid>`), exclusive and auto-deleted: declared
//! with the progress queues' arguments, written through the default exchange, read back.

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation, Connection, ExchangeKind};

use crate::config::{BrokerConfig, Config, RabbitMqConfig};
use crate::failure::{Class, Failure};
use crate::preflight::Check;
use crate::sink::rabbitmq::{dial, progress_arguments};

const NODE: &str = "rabbitmq node";
const CREDENTIALS: &str = "rabbitmq credentials";
const PUBLISH: &str = "rabbitmq publish permission";
const PROGRESS: &str = "rabbitmq progress queues";

/// The checks, when RabbitMQ is the broker; none otherwise.
pub async fn checks(config: &Config) -> Vec<Check> {
    match &config.broker {
        BrokerConfig::RabbitMq(r) => checks_of(r).await,
        _ => Vec::new(),
    }
}

fn exchange_name(config: &RabbitMqConfig) -> String {
    format!("rabbitmq exchange {:?}", config.exchange)
}

/// The checks of `[rabbitmq]` `config`.
pub async fn checks_of(config: &RabbitMqConfig) -> Vec<Check> {
    let exchange = exchange_name(config);
    let conn = match dial(config).await {
        Ok(c) => c,
        Err(e) if e.class == Class::Fatal(Failure::Auth) => {
            return vec![
                Check::ok(NODE, "answers"),
                Check::fail(
                    CREDENTIALS,
                    e.message,
                    "check the url's user, rabbitmq.password_file and the user's access to the virtual host (rabbitmqctl list_user_permissions <user>)",
                ),
                Check::skipped(exchange, "rabbitmq credentials"),
                Check::skipped(PUBLISH, "rabbitmq credentials"),
                Check::skipped(PROGRESS, "rabbitmq credentials"),
            ];
        }
        Err(e) => {
            return vec![
                Check::fail(
                    NODE,
                    e.message,
                    "check rabbitmq.url (host, port, amqp/amqps) and that the node runs",
                ),
                Check::skipped(CREDENTIALS, "rabbitmq node"),
                Check::skipped(exchange, "rabbitmq node"),
                Check::skipped(PUBLISH, "rabbitmq node"),
                Check::skipped(PROGRESS, "rabbitmq node"),
            ];
        }
    };
    let mut checks = vec![
        Check::ok(NODE, "answers"),
        Check::ok(CREDENTIALS, "accepted"),
    ];
    let exchange_check = check_exchange(&conn, config).await;
    let exists = exchange_check.status == crate::preflight::Status::Ok;
    checks.push(exchange_check);
    checks.push(if exists {
        check_publish(&conn, config).await
    } else {
        Check::skipped(PUBLISH, &exchange_name(config))
    });
    checks.push(check_progress(&conn, config).await);
    let _ = conn.close(200, "walbox check done".into()).await;
    checks
}

async fn check_exchange(conn: &Connection, config: &RabbitMqConfig) -> Check {
    let name = exchange_name(config);
    if config.exchange.is_empty() {
        return Check::ok(name, "the default exchange (routing key = queue name)");
    }
    let channel = match conn.create_channel().await {
        Ok(c) => c,
        Err(e) => {
            return Check::fail(
                name,
                format!("cannot open a channel: {e}"),
                "check the node's channel_max",
            )
        }
    };
    let declared = channel
        .exchange_declare(
            config.exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    match declared {
        Ok(()) => {
            let _ = channel.close(200, "ok".into()).await;
            Check::ok(name, "exists")
        }
        Err(e) if crate::sink::rabbitmq::is_not_found(&e) => Check::fail(
            name,
            "does not exist (walbox does not declare it)",
            format!(
                "rabbitmqadmin declare exchange name={} type=topic durable=true (or fix rabbitmq.exchange)",
                config.exchange
            ),
        ),
        Err(e) => Check::fail(name, e.to_string(), "check the user's permissions on the virtual host"),
    }
}

async fn check_publish(conn: &Connection, config: &RabbitMqConfig) -> Check {
    let grant = format!(
        "grant write permission on exchange {:?}: rabbitmqctl set_permissions -p <vhost> <user> <configure> '<write regex matching {}>' <read>",
        config.exchange, config.exchange
    );
    let channel = match conn.create_channel().await {
        Ok(c) => c,
        Err(e) => return Check::fail(PUBLISH, format!("cannot open a channel: {e}"), grant),
    };
    if let Err(e) = channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
    {
        return Check::fail(PUBLISH, format!("publisher confirms refused: {e}"), grant);
    }
    let mut headers = FieldTable::default();
    headers.insert("walbox.check".into(), AMQPValue::LongString("probe".into()));
    let key = format!("walbox.check.{}", std::process::id());
    let published = channel
        .basic_publish(
            config.exchange.as_str().into(),
            key.as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            b"",
            BasicProperties::default()
                .with_type("walbox.check".into())
                .with_expiration("0".into())
                .with_headers(headers),
        )
        .await;
    let confirmed = match published {
        Ok(confirm) => confirm.await,
        Err(e) => Err(e),
    };
    let _ = channel.close(200, "ok".into()).await;
    match confirmed {
        Ok(Confirmation::Ack(Some(_))) => Check::ok(PUBLISH, "a probe was accepted and returned unroutable, as expected"),
        Ok(Confirmation::Ack(None) | Confirmation::NotRequested) => Check::ok(
            PUBLISH,
            format!("a probe (type walbox.check, expiring at once) was accepted and routed by key {key:?}: the exchange routes every key"),
        ),
        Ok(Confirmation::Nack(_)) => Check::warn(PUBLISH, "the node nacked the probe", "check the node's log for a failed queue"),
        Err(e) => Check::fail(PUBLISH, e.to_string(), grant),
    }
}

async fn check_progress(conn: &Connection, config: &RabbitMqConfig) -> Check {
    let queue = format!("{}.check-{}", config.progress_queue, std::process::id());
    let fix = format!(
        "grant configure, write and read permission on queues named {}.*",
        config.progress_queue
    );
    let run = async {
        let channel = conn.create_channel().await?;
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
                progress_arguments(),
            )
            .await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                b"{}",
                BasicProperties::default(),
            )
            .await?
            .await?;
        let got = channel
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await?;
        let _ = channel.close(200, "ok".into()).await;
        Ok::<bool, lapin::Error>(got.is_some())
    };
    match run.await {
        Ok(true) => Check::ok(
            PROGRESS,
            format!(
                "{}.<slot> can be declared, written and read",
                config.progress_queue
            ),
        ),
        Ok(false) => Check::fail(
            PROGRESS,
            "a record written to a probe queue was not read back",
            fix,
        ),
        Err(e) => Check::fail(PROGRESS, e.to_string(), fix),
    }
}
