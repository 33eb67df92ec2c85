//! The message brokers other than Kafka, as real servers: Redis, NATS with JetStream and
//! RabbitMQ (Debian's packages, installed by `scripts/install-deps.sh`). One shared server of
//! each per test binary, started on first use and killed by its watchdog when the binary exits,
//! like the PostgreSQL cluster; tests share it with keys, streams and queues of their own. A
//! test that stops or restarts a broker starts one of its own (`own_*`), dropped at its end.
//!
//! A server whose program is not installed makes the test that wants it skip, saying so on
//! stderr, except under CI (`CI` set), where `.ci/run` installs them and a missing one fails.

use std::sync::OnceLock;
use std::time::Instant;

use walbox::sandbox::daemon::DaemonError;
use walbox::sandbox::nats::{NatsOptions, NatsServer};
use walbox::sandbox::rabbitmq::{RabbitMq, RabbitMqOptions};
use walbox::sandbox::redis::{RedisOptions, RedisServer};

/// `started`'s server, or `None` (with a line on stderr) when its program is not installed;
/// panics on any other failure, and on a missing program under CI.
fn available<T>(what: &str, started: Result<T, DaemonError>) -> Option<T> {
    match started {
        Ok(server) => Some(server),
        Err(e @ DaemonError::NotInstalled(..)) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no {what}: {e}");
            None
        }
        Err(e) => panic!("start {what}: {e}"),
    }
}

/// Starts a server with `start`, saying on stderr how long it took.
fn timed<T>(what: &str, start: impl FnOnce() -> Result<T, DaemonError>) -> Option<T> {
    let began = Instant::now();
    let server = available(what, start())?;
    eprintln!("{what} started in {:?}", began.elapsed());
    Some(server)
}

/// The Redis server shared by the binary (in memory, no append-only file).
pub fn redis() -> Option<&'static RedisServer> {
    static SERVER: OnceLock<Option<RedisServer>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            own_redis(RedisOptions {
                watchdog: true,
                ..Default::default()
            })
        })
        .as_ref()
}

/// A Redis server of the calling test's own.
pub fn own_redis(opts: RedisOptions) -> Option<RedisServer> {
    timed("redis-server", || RedisServer::start(opts))
}

/// The NATS server (JetStream on) shared by the binary.
pub fn nats() -> Option<&'static NatsServer> {
    static SERVER: OnceLock<Option<NatsServer>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            own_nats(NatsOptions {
                watchdog: true,
                ..Default::default()
            })
        })
        .as_ref()
}

/// A NATS server of the calling test's own.
pub fn own_nats(opts: NatsOptions) -> Option<NatsServer> {
    timed("nats-server", || NatsServer::start(opts))
}

/// The RabbitMQ node shared by the binary.
pub fn rabbitmq() -> Option<&'static RabbitMq> {
    static SERVER: OnceLock<Option<RabbitMq>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            own_rabbitmq(RabbitMqOptions {
                watchdog: true,
                ..Default::default()
            })
        })
        .as_ref()
}

/// A RabbitMQ node of the calling test's own.
pub fn own_rabbitmq(opts: RabbitMqOptions) -> Option<RabbitMq> {
    timed("rabbitmq-server", || RabbitMq::start(opts))
}
