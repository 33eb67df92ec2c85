//! The compose stack without containers: `deploy/compose.yaml`'s init script (and so
//! `migrations/`), topics, configuration files and writer, on a throwaway PostgreSQL cluster and
//! the test broker.

use std::process::Command;

use super::{dashboard, deploy, exposition_names, metric_names, queries};
use crate::support::{
    broker, free_port, http_get, metric, pg_options, start_cluster, wait_until, Walbox, WAIT,
};

/// `kafka-topics.sh`'s topics: (name, partitions).
fn compose_topics() -> Vec<(String, i32)> {
    let script = std::fs::read_to_string(deploy().join("compose/kafka-topics.sh")).unwrap();
    let topics: Vec<_> = script
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let after = |flag: &str| Some(words[words.iter().position(|w| *w == flag)? + 1]);
            Some((
                after("--topic")?.to_owned(),
                after("--partitions")?.parse().ok()?,
            ))
        })
        .collect();
    assert!(topics.len() >= 3, "no topics found in kafka-topics.sh");
    topics
}

/// psql against `cluster` over its socket, as its superuser.
fn psql(cluster: &walbox::sandbox::postgres::PgCluster, db: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([
            "-X",
            "-q",
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-U",
            "walbox",
            "-d",
            db,
            "-c",
            sql,
        ])
        .env("PGHOST", cluster.socket_dir())
        .env("PGPORT", cluster.port().to_string())
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The compose stack without containers: its init script (and so `migrations/`), its topics,
/// walbox and the inbox with its configuration files (addresses overridden), and its writer,
/// on a throwaway PostgreSQL cluster and the test broker. Every payment the writer commits
/// ends up once in the consumer's ledger, or in a dead-letter topic for the reason the stack
/// gives (an unrouted topic, a zero amount the ledger refuses).
#[test]
fn the_compose_stack_relays_the_writers_payments_into_the_ledger() {
    let mut opts = pg_options();
    opts.settings
        .push(("max_slot_wal_keep_size".into(), "1GB".into()));
    let cluster = start_cluster(opts);
    psql(&cluster, "postgres", "CREATE DATABASE app");
    let init = Command::new("bash")
        .arg(deploy().join("compose/postgres-init.sh"))
        .env("PGHOST", cluster.socket_dir())
        .env("PGPORT", cluster.port().to_string())
        .env("POSTGRES_USER", "walbox")
        .env("MIGRATIONS_DIR", deploy().join("../migrations"))
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "postgres-init.sh: {}",
        String::from_utf8_lossy(&init.stderr)
    );

    let broker = broker();
    for (topic, partitions) in compose_topics() {
        // The test broker comes with walbox's progress topic.
        if topic != walbox::config::DEFAULT_PROGRESS_TOPIC {
            broker.create_topic(&topic, partitions).unwrap();
        }
    }
    let brokers = broker.bootstrap_servers();
    let config = |name: &str| deploy().join("compose").join(name).display().to_string();
    let (relay_port, inbox_port) = (free_port(), free_port());
    let relay = Walbox::spawn_subcommand(
        "run",
        &[
            ("WALBOX_CONFIG", config("walbox.toml")),
            ("WALBOX_POSTGRES_URL", cluster.url("app")),
            ("WALBOX_KAFKA_BROKERS", brokers.clone()),
            ("WALBOX_HTTP_LISTEN", format!("127.0.0.1:{relay_port}")),
            ("WALBOX_POSTGRES_STATUS_INTERVAL", "100ms".into()),
        ],
    );
    // As in the compose file, the writer starts once walbox streams from its slot.
    wait_until(WAIT, "walbox's /readyz", || {
        http_get(relay_port, "/readyz").is_some_and(|(code, _)| code == 200)
    });
    let inbox = Walbox::spawn_subcommand(
        "inbox",
        &[
            ("WALBOX_INBOX_CONFIG", config("inbox.toml")),
            // The role the init script creates, as in the compose file.
            (
                "WALBOX_INBOX_POSTGRES_URL",
                cluster.role_url("billing", "billing", "billing"),
            ),
            ("WALBOX_INBOX_KAFKA_BROKERS", brokers.clone()),
            (
                "WALBOX_INBOX_HTTP_LISTEN",
                format!("127.0.0.1:{inbox_port}"),
            ),
        ],
    );
    // Its last words end up here: the termination below makes it complain.
    let writer_log = tempfile::NamedTempFile::new().unwrap();
    let mut writer = Command::new("psql")
        .args([
            "-X",
            "-q",
            "-U",
            "app",
            "-d",
            "app",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "rate=3000",
            "-f",
        ])
        .arg(deploy().join("compose/writer.sql"))
        .env("PGHOST", cluster.socket_dir())
        .env("PGPORT", cluster.port().to_string())
        .env("PGAPPNAME", "writer")
        .stdout(std::process::Stdio::null())
        .stderr(writer_log.reopen().unwrap())
        .spawn()
        .unwrap();
    wait_until(WAIT, "the writer's first 3,000 payments", || {
        if let Some(status) = writer.try_wait().unwrap() {
            let log = std::fs::read_to_string(writer_log.path()).unwrap_or_default();
            panic!("the writer stopped ({status}): {log}");
        }
        psql(&cluster, "app", "SELECT count(*) FROM outbox")
            .parse::<u64>()
            .unwrap()
            >= 3000
    });
    // Killing psql leaves its backend running the DO loop: end the backend itself.
    psql(
        &cluster,
        "postgres",
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'writer'",
    );
    wait_until(WAIT, "the writer's backend to end", || {
        psql(
            &cluster,
            "postgres",
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'writer'",
        ) == "0"
    });
    let _ = writer.wait();

    let count = |sql: &str| psql(&cluster, "app", sql).parse::<u64>().unwrap();
    let payments = count("SELECT count(*) FROM payments");
    assert_eq!(
        count("SELECT count(*) FROM outbox"),
        payments,
        "one outbox row per payment"
    );
    let unrouted = count("SELECT count(*) FROM outbox WHERE topic <> 'payments.events'");
    let refused = count(
        "SELECT count(*) FROM outbox WHERE topic = 'payments.events' AND (payload->>'amount')::numeric = 0",
    );
    let routed_sum =
        "SELECT sum((payload->>'amount')::numeric) FROM outbox WHERE topic = 'payments.events'";
    let expected = format!(
        "{}|{}",
        payments - unrouted - refused,
        psql(&cluster, "app", routed_sum)
    );
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let ledger = psql(
            &cluster,
            "billing",
            "SELECT count(*) || '|' || sum(amount) FROM ledger",
        );
        if ledger == expected {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the ledger holds {ledger} (rows|sum), expected {expected}; walbox inbox's log:\n{}",
            inbox.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let dead_letters = |port: u16, name: &str| {
        let body = http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default();
        metric(&body, name)
    };
    wait_until(WAIT, "walbox to dead-letter the unrouted payments", || {
        dead_letters(relay_port, "walbox_dead_letter_total") == Some(unrouted as f64)
    });
    wait_until(WAIT, "the inbox to dead-letter the zero amounts", || {
        dead_letters(inbox_port, "walbox_inbox_dead_lettered_total") == Some(refused as f64)
    });

    // A real scrape of each process holds every series the dashboard queries.
    let wanted: std::collections::BTreeSet<String> = queries(&dashboard())
        .iter()
        .flat_map(|(_, expr)| metric_names(expr))
        .collect();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let mut scraped = std::collections::BTreeSet::new();
        for port in [relay_port, inbox_port] {
            let body = http_get(port, "/metrics")
                .map(|(_, b)| b)
                .unwrap_or_default();
            scraped.extend(exposition_names(&body));
        }
        let missing: Vec<_> = wanted.difference(&scraped).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the dashboard queries {missing:?}, which no /metrics of the stack exposes"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    drop((relay, inbox));
}
