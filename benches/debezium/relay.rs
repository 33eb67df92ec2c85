//! The two relays under test, started the same way from the bench's point of view: a child
//! process reading its own replication slot of the bench database over TCP (127.0.0.1), writing
//! to topics of its own on the bench's Apache Kafka broker. walbox runs in `compat = "debezium"`
//! with the router's default columns; Debezium's Outbox Event Router with its defaults; both
//! route to `bench.<relay>.<run>.<aggregatetype>`.

use std::time::Instant;

use anyhow::Context;
use walbox::sandbox::debezium::{Connect, ConnectorSpec, Database};
use walbox::sandbox::postgres::{PgCluster, SUPERUSER};

use crate::procs::WalboxChild;
use crate::{Settings, DATABASE, PUBLICATION};

/// Which relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The walbox binary.
    Walbox,
    /// Kafka Connect standalone with the Debezium PostgreSQL connector and the router.
    Debezium,
}

impl Which {
    /// Its name in topics and the report.
    pub fn name(self) -> &'static str {
        match self {
            Which::Walbox => "walbox",
            Which::Debezium => "Debezium",
        }
    }

    /// The topic a run's events of routing value `aggregate` go to.
    pub fn topic(self, run: &str, aggregate: &str) -> String {
        let short = match self {
            Which::Walbox => "wbx",
            Which::Debezium => "dbz",
        };
        format!("bench.{short}.{run}.{aggregate}")
    }
}

/// A running relay process.
pub enum Relay {
    /// walbox.
    Walbox(WalboxChild),
    /// Kafka Connect's JVM.
    Debezium(Box<Connect>),
}

impl Relay {
    /// Spawns `which` on the existing slot `slot`, routing under `run`; returns at once, with
    /// the instant of the spawn.
    pub fn spawn(
        which: Which,
        cluster: &PgCluster,
        bootstrap: &str,
        slot: &str,
        run: &str,
        settings: &Settings,
    ) -> anyhow::Result<(Relay, Instant)> {
        let topic = which.topic(run, "${routedByValue}");

        match which {
            Which::Walbox => {
                let started = Instant::now();
                let mut env = vec![
                    ("WALBOX_OUTBOX_COMPAT", "debezium".to_owned()),
                    ("WALBOX_OUTBOX_TOPIC", which.topic(run, "${aggregate_type}")),
                ];
                env.extend(
                    settings
                        .walbox_env
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.clone())),
                );
                // A diagnosis only (`WALBOX_BENCH_WALBOX_SOCKET=1`): walbox over the Unix
                // socket, Debezium still over TCP.
                let url = if settings.walbox_socket {
                    cluster.socket_url(DATABASE)
                } else {
                    cluster.url(DATABASE)
                };
                let child = WalboxChild::start(&url, slot, PUBLICATION, bootstrap, false, &env)?;
                Ok((Relay::Walbox(child), started))
            }
            Which::Debezium => {
                let name = format!("dbz_{run}");
                // The bench made the slot and the publication; TCP without TLS, as walbox.
                let mut extra = vec![
                    ("publication.autocreate.mode", "disabled".to_owned()),
                    ("database.sslmode", "disable".to_owned()),
                ];
                extra.extend(
                    settings
                        .debezium_props
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.clone())),
                );
                let connect = Connect::spawn(&ConnectorSpec {
                    name: &name,
                    db: Database {
                        host: "127.0.0.1",
                        port: cluster.port(),
                        user: SUPERUSER,
                        password: cluster.password(),
                        dbname: DATABASE,
                    },
                    slot,
                    publication: PUBLICATION,
                    bootstrap,
                    router: &[("route.topic.replacement", topic)],
                    extra: &extra,
                })
                .context("starting Kafka Connect")?;
                let started = connect.started();
                Ok((Relay::Debezium(Box::new(connect)), started))
            }
        }
    }

    /// The relay's process id (walbox, or Connect's JVM).
    pub fn pid(&self) -> u32 {
        match self {
            Relay::Walbox(w) => w.pid(),
            Relay::Debezium(c) => c.pid(),
        }
    }

    /// Fails when the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        match self {
            Relay::Walbox(w) => w.check_alive(),
            Relay::Debezium(c) => Ok(c.check_alive()?),
        }
    }

    /// Stops the process: walbox with SIGTERM (it finishes in-flight work), Connect with
    /// SIGKILL (its work for the bench is done once the events are in Kafka).
    pub fn stop(self) -> anyhow::Result<()> {
        match self {
            Relay::Walbox(w) => w.stop(),
            Relay::Debezium(mut c) => {
                c.kill();
                Ok(())
            }
        }
    }
}
