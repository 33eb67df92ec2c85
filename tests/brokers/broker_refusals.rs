//! `walbox run` against a broker that refuses every record of a destination until an operator
//! acts: permission denied (a Redis ACL user without `+xadd`, a NATS user whose publish
//! permissions exclude the subject, a RabbitMQ user without write permission on the exchange)
//! and a full NATS stream (`max_msgs`, `discard: new`) stop walbox with exit 9, one line naming
//! the destination and what to do, no secret, nothing confirmed past the refused event; once
//! the operator grants the permission (raises the limit), a restarted walbox delivers
//! everything (NATS, Redis: each once). Where the refusal heals by itself (Redis `OOM` under
//! `maxmemory`, a RabbitMQ queue full with `reject-publish`: consumers or the operator free
//! room), walbox keeps running, logs the refusal on every attempt, confirms nothing past it,
//! and delivers everything once there is room.

use std::collections::HashSet;

use walbox::sandbox::nats::NatsOptions;
use walbox::sandbox::redis::RedisOptions;

use crate::broker_audit::insert;
use crate::broker_relay::{env_with, Target};
use crate::broker_targets::{limit_nats_stream, NatsTarget, RabbitTarget, RedisTarget};
use crate::support::brokers::{nats, own_nats, own_redis, rabbitmq, redis};
use crate::support::events::distinct_ids;
use crate::support::{unique, wait_until_or, TestDb, Walbox, WAIT};

/// A test's database and slot, walbox's variables for `target` (with `extra`), and then
/// ([`Three::write`]) three transactions of one event each for the target's destination: their
/// ids and commits.
struct Three {
    db: TestDb,
    slot: String,
    env: Vec<(String, String)>,
    ids: Vec<i64>,
    commits: Vec<(walbox::lsn::Lsn, walbox::lsn::Lsn)>,
}

fn three(target: &dyn Target, extra: &[(&str, String)], tag: &str) -> Three {
    let db = TestDb::new(tag);
    let slot = db.name.clone();
    db.create_slot_and_publication(&slot);
    let env = env_with(&db, &slot, target, extra);
    Three {
        db,
        slot,
        env,
        ids: Vec::new(),
        commits: Vec::new(),
    }
}

impl Three {
    /// Commits the three events for `destination`.
    fn write(&mut self, destination: &str) {
        self.ids = (0..3)
            .map(|i| insert(&self.db, destination, &format!("a{i}")))
            .collect();
        self.commits = self.db.commits(&self.slot);
        assert_eq!(self.commits.len(), 3);
    }

    /// Walbox is restarted (or kept running) after the fix: every event arrives and the last
    /// transaction is confirmed; NATS and Redis hold each once.
    fn all_delivered(&self, target: &mut dyn Target, walbox: &Walbox) {
        let all: HashSet<i64> = self.ids.iter().copied().collect();
        wait_until_or(
            WAIT,
            "every event delivered and confirmed",
            || {
                distinct_ids(&target.read_all()) == all
                    && self.db.confirmed(&self.slot) >= self.commits[2].1
            },
            || walbox.log(),
        );
        let records = target.read_all();
        if !target.duplicates_possible() {
            assert_eq!(records.len(), 3, "each once: {}", walbox.log());
        }
    }

    /// Nothing past the event of commit `refused` is confirmed, and the broker holds exactly
    /// the events before it.
    fn nothing_past(&self, target: &mut dyn Target, refused: usize, log: &str) {
        assert!(
            self.db.confirmed(&self.slot) < self.commits[refused].1,
            "confirmed past the refused event: {log}"
        );
        let before: HashSet<i64> = self.ids[..refused].iter().copied().collect();
        assert_eq!(distinct_ids(&target.read_all()), before, "{log}");
    }
}

/// Walbox meets a refusal no retry heals at the event of commit `refused` (of three): exit 9,
/// its last line names each of `names`, `secret` (if any) is nowhere in its output, nothing past the
/// event is confirmed; after `fix`, a restarted walbox delivers everything.
fn refused_until_fixed(
    target: &mut dyn Target,
    extra: &[(&str, String)],
    secret: Option<&str>,
    refused: usize,
    names: &[&str],
    fix: &mut dyn FnMut(),
    tag: &str,
) {
    let mut run = three(target, extra, tag);
    run.write(&target.destination());
    let mut walbox = Walbox::spawn(&run.env);
    let status = walbox.wait_exit(WAIT);
    let (line, log) = (walbox.last_line(), walbox.log());
    assert_eq!(status.code(), Some(9), "{log}");
    for name in names {
        assert!(line.contains(name), "the error names {name}: {line}");
    }
    if let Some(secret) = secret {
        assert!(!log.contains(secret), "the secret is printed: {log}");
    }
    run.nothing_past(target, refused, &log);
    fix();
    let mut walbox = Walbox::spawn(&run.env);
    run.all_delivered(target, &walbox);
    assert!(walbox.running(), "walbox exited:\n{}", walbox.log());
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

/// Walbox, streaming, meets a refusal that frees itself (made by `fill`) at the event of
/// commit `refused`: it logs `logged`, keeps running and tries again (a second session ends on
/// the refusal: Redis refuses the progress record each session writes first, RabbitMQ the
/// event again), nothing past the event confirmed; after `fix`, the same walbox delivers
/// everything.
fn refused_while_full(
    target: &mut dyn Target,
    refused: usize,
    logged: &str,
    fill: &mut dyn FnMut(),
    fix: &mut dyn FnMut(),
    tag: &str,
) {
    let mut run = three(target, &[], tag);
    let mut walbox = Walbox::spawn(&run.env);
    wait_until_or(
        WAIT,
        "walbox streaming",
        || run.db.streaming(&run.slot),
        || walbox.log(),
    );
    fill();
    run.write(&target.destination());
    wait_until_or(
        WAIT,
        "the refusal logged, and a second attempt",
        || {
            let log = walbox.log();
            log.contains(logged) && log.matches("session ended; reconnecting").count() >= 2
        },
        || walbox.log(),
    );
    assert!(walbox.running(), "walbox exited:\n{}", walbox.log());
    // A later session fails first on its progress record: the advice fits the refusal (room,
    // not a permission to grant).
    let log = walbox.log();
    assert!(!log.contains("the right to write there"), "{log}");
    run.nothing_past(target, refused, &log);
    fix();
    run.all_delivered(target, &walbox);
    assert!(walbox.running(), "walbox exited:\n{}", walbox.log());
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn redis_a_user_without_xadd_exits_9_until_granted() {
    let Some(server) = redis() else { return };
    let mut target = RedisTarget::new(server.url());
    let (user, secret) = (unique("walbox_user"), unique("s3cret"));
    let acl = |rules: &[&str]| {
        let mut args = vec!["ACL", "SETUSER", &user];
        args.extend(rules);
        assert_eq!(server.command(&args).unwrap(), "+OK\r\n");
    };
    let password = format!(">{secret}");
    acl(&["on", &password, "~*", "&*", "+@all", "-xadd"]);
    let stream = format!("{:?}", target.destination());
    refused_until_fixed(
        &mut target,
        &[
            ("WALBOX_REDIS_USER", user.clone()),
            ("WALBOX_REDIS_PASSWORD", secret.clone()),
        ],
        Some(&secret),
        0,
        &[&stream, "+xadd"],
        &mut || acl(&["+xadd"]),
        "redis_noperm",
    );
}

/// A NATS configuration: anonymous clients are `admin` (the tests' reader), and user `walbox`
/// may use JetStream's API and the key-value buckets, and publish to `granted`.
fn nats_users(secret: &str, granted: &str) -> String {
    format!(
        "no_auth_user: admin\nauthorization {{\n users = [\n  {{ user: admin, password: admin-pw }}\n  \
         {{ user: walbox, password: \"{secret}\", permissions: {{\n   \
         publish: {{ allow: [\"$JS.API.>\", \"$KV.>\"{granted}] }},\n   \
         subscribe: {{ allow: [\"_INBOX.>\"] }} }} }}\n ]\n}}\n"
    )
}

#[test]
fn nats_a_subject_the_user_may_not_publish_to_exits_9_until_granted() {
    let secret = unique("s3cret");
    let Some(mut server) = own_nats(NatsOptions {
        config: Some(nats_users(&secret, "")),
        ..Default::default()
    }) else {
        return;
    };
    let mut target = NatsTarget::new(server.url());
    let subject = target.destination();
    let quoted = format!("{subject:?}");
    let granted = format!(", \"{}.>\"", target.stream());
    refused_until_fixed(
        &mut target,
        &[
            ("WALBOX_NATS_USER", "walbox".into()),
            ("WALBOX_NATS_PASSWORD", secret.clone()),
            ("WALBOX_NATS_ACK_TIMEOUT", "2s".into()),
        ],
        Some(&secret),
        0,
        &[&quoted, "user \"walbox\"", "publish permission"],
        &mut || {
            server.set_config(&nats_users(&secret, &granted)).unwrap();
            server.restart().expect("restart nats");
        },
        "nats_noperm",
    );
}

#[test]
fn rabbitmq_a_user_without_write_permission_exits_9_until_granted() {
    let Some(node) = rabbitmq() else { return };
    let mut target = RabbitTarget::new(node.port());
    let (user, secret) = (unique("walbox_user"), unique("s3cret"));
    let ctl = |args: &[&str]| {
        node.run("rabbitmqctl", args).expect("rabbitmqctl");
    };
    ctl(&["add_user", &user, &secret]);
    ctl(&[
        "set_permissions",
        "-p",
        "/",
        &user,
        ".*",
        "^amq\\.default$",
        ".*",
    ]);
    let exchange = format!("exchange {:?}", target.exchange());
    refused_until_fixed(
        &mut target,
        &[
            (
                "WALBOX_RABBITMQ_URL",
                format!("amqp://{user}@127.0.0.1:{}/%2f", node.port()),
            ),
            ("WALBOX_RABBITMQ_PASSWORD", secret.clone()),
        ],
        Some(&secret),
        0,
        &[&exchange, "write permission", &format!("{user:?}")],
        &mut || ctl(&["set_permissions", "-p", "/", &user, ".*", ".*", ".*"]),
        "rabbit_noperm",
    );
}

#[test]
fn nats_a_full_stream_exits_9_until_its_limit_is_raised() {
    let Some(server) = nats() else { return };
    let mut target = NatsTarget::new(server.url());
    let name = target.stream().to_owned();
    limit_nats_stream(&server.url(), &name, 1);
    let stream = format!("stream {name:?}");
    refused_until_fixed(
        &mut target,
        &[],
        None,
        1,
        &[&stream, "max_msgs", "restart walbox"],
        &mut || limit_nats_stream(&server.url(), &name, -1),
        "nats_full",
    );
}

#[test]
fn redis_out_of_memory_is_retried_and_logged_until_memory_is_freed() {
    let Some(server) = own_redis(RedisOptions::default()) else {
        return;
    };
    let mut target = RedisTarget::new(server.url());
    let config = |value: &str| {
        let reply = server
            .command(&["CONFIG", "SET", "maxmemory", value])
            .unwrap();
        assert_eq!(reply, "+OK\r\n");
    };
    let logged = format!("to {:?}: redis is out of memory", target.destination());
    refused_while_full(
        &mut target,
        0,
        &logged,
        &mut || config("1"),
        &mut || config("0"),
        "redis_oom",
    );
}

#[test]
fn rabbitmq_a_queue_full_with_reject_publish_is_retried_and_logged_until_there_is_room() {
    let Some(node) = rabbitmq() else { return };
    let mut target = RabbitTarget::new(node.port());
    let policy = unique("full");
    let pattern = format!("^{}$", target.queue());
    refused_while_full(
        &mut target,
        1,
        "x-overflow reject-publish",
        &mut || {
            node.run(
                "rabbitmqctl",
                &[
                    "set_policy",
                    "-p",
                    "/",
                    "--apply-to",
                    "queues",
                    &policy,
                    &pattern,
                    r#"{"max-length":1,"overflow":"reject-publish"}"#,
                ],
            )
            .expect("set_policy");
        },
        &mut || {
            node.run("rabbitmqctl", &["clear_policy", "-p", "/", &policy])
                .expect("clear_policy");
        },
        "rabbit_full",
    );
}
