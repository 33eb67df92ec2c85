//! The inbox in its consumer group, on the group coordinator: a second member joining moves
//! only the partitions that change owner (cooperative-sticky), and a restarted static member
//! (`kafka.group_instance_id`) gets its partitions back at once, without a rebalance, after a
//! SIGTERM and after a SIGKILL. librdkafka's mock cluster implements no static membership:
//! the restart test needs a real broker (`WALBOX_TEST_KAFKA=apache`) and says so elsewhere.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::{
    assert_applied_in_order, assert_exactly_once, effects, free_port, inbox_db, inbox_env, metric,
    produce, rec, wait_metric, Form, Rec,
};
use crate::support::{self, wait_until, Walbox, WAIT};

const CONSUMED: &str = "walbox_inbox_records_consumed_total";
const ASSIGNED: &str = "walbox_inbox_assigned_partitions";
const REVOKED: &str = "walbox_inbox_partitions_revoked_total";

/// The longest a restarted static member may take to process again (the bound).
const RESTART_STALL_MAX: Duration = Duration::from_secs(5);

/// Records numbered per aggregate (20 aggregates), so order shows across the handovers.
struct Bursts {
    next: HashMap<String, u32>,
    total: Cell<i64>,
}

impl Bursts {
    fn new() -> Self {
        Bursts {
            next: HashMap::new(),
            total: Cell::new(0),
        }
    }

    fn take(&mut self, n: usize) -> Vec<Rec> {
        (0..n)
            .map(|_| {
                let i = self.total.get();
                self.total.set(i + 1);
                let key = format!("agg-{}", i % 20);
                let k = self.next.entry(key.clone()).or_default();
                *k += 1;
                rec(&key, &format!("evt-{i}"), &format!("{{\"n\": {k}}}"))
            })
            .collect()
    }
}

/// The partitions named by the `field=` value of `line` (`list=t[0,2]` or `owned=t[1]`).
fn partitions_in(line: &str, field: &str) -> BTreeSet<i32> {
    let Some(at) = line.find(&format!("{field}=")) else {
        return BTreeSet::new();
    };
    let rest = &line[at..];
    let (Some(open), Some(close)) = (rest.find('['), rest.find(']')) else {
        return BTreeSet::new();
    };
    rest[open + 1..close]
        .split(',')
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

/// Every partition a member's log says was revoked from it.
fn revoked_in(log: &str) -> BTreeSet<i32> {
    log.lines()
        .filter(|l| l.contains("partitions revoked"))
        .flat_map(|l| partitions_in(l, "list"))
        .collect()
}

/// What a member owned after its last assignment, by its log.
fn owned_in(log: &str) -> BTreeSet<i32> {
    log.lines()
        .rfind(|l| l.contains("partitions assigned"))
        .map(|l| partitions_in(l, "owned"))
        .unwrap_or_default()
}

fn a_live_rebalance_moves_only_the_partitions_that_change_owner(form: Form) {
    let db = inbox_db("inbox_rebalance");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 4).expect("topic");
    let brokers = broker.bootstrap_servers();
    let group = format!("g_{}", db.name);
    let mut bursts = Bursts::new();
    let env = |port: u16, instance: &str| {
        form.env(inbox_env(
            &db,
            &brokers,
            &group,
            &topic,
            port,
            &[("WALBOX_INBOX_KAFKA_GROUP_INSTANCE_ID", instance)],
        ))
    };

    let port_a = free_port();
    let mut a = Walbox::spawn_subcommand("inbox", &env(port_a, "inbox-a"));
    produce(&brokers, &topic, &bursts.take(200));
    wait_metric(port_a, CONSUMED, 200.0, &a);
    wait_metric(port_a, ASSIGNED, 4.0, &a);

    // A second member joins while records keep coming.
    let port_b = free_port();
    let mut b = Walbox::spawn_subcommand("inbox", &env(port_b, "inbox-b"));
    wait_until(WAIT, "the second member to process records", || {
        produce(&brokers, &topic, &bursts.take(20));
        metric(port_b, CONSUMED).unwrap_or(0.0) > 0.0
    });
    wait_metric(port_b, ASSIGNED, 2.0, &b);
    wait_metric(port_a, ASSIGNED, 2.0, &a);
    produce(&brokers, &topic, &bursts.take(200));
    wait_until(WAIT, "every effect with two members", || {
        effects(&db) == bursts.total.get()
    });
    let (by_a, by_b) = (
        metric(port_a, CONSUMED).expect("a's metrics"),
        metric(port_b, CONSUMED).expect("b's metrics"),
    );
    assert!(by_a > 200.0 && by_b > 0.0, "a {by_a}, b {by_b}");
    // Cooperative rebalancing: the first member gave up exactly the two partitions that moved
    // to the second and kept the other two throughout; an eager rebalance revokes all four
    // and assigns two back.
    let (log_a, log_b) = (a.log(), b.log());
    assert_eq!(
        metric(port_a, REVOKED),
        Some(2.0),
        "a's revocations:\n{log_a}"
    );
    let moved = revoked_in(&log_a);
    let kept = owned_in(&log_a);
    assert_eq!(
        moved,
        owned_in(&log_b),
        "a gave b what it revoked:\n{log_a}"
    );
    assert_eq!(moved.len(), 2, "{log_a}");
    assert!(
        moved.is_disjoint(&kept) && kept.len() == 2,
        "a kept {kept:?} and revoked {moved:?}:\n{log_a}"
    );

    // The second member leaves: its partitions go back to the first, which revokes nothing.
    b.terminate();
    assert!(b.wait_exit(WAIT).success(), "{}", b.log());
    produce(&brokers, &topic, &bursts.take(200));
    wait_until(WAIT, "every effect after the second member left", || {
        effects(&db) == bursts.total.get()
    });
    wait_metric(port_a, ASSIGNED, 4.0, &a);
    assert_eq!(metric(port_a, REVOKED), Some(2.0), "{}", a.log());
    let log = a.log();
    a.terminate();
    assert!(a.wait_exit(WAIT).success(), "{log}");

    assert_exactly_once(&db, bursts.total.get());
    assert_applied_in_order(&db);
}

/// How a member is restarted.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Term,
    Kill,
}

fn a_restarted_static_member_gets_its_partitions_back_without_a_rebalance(form: Form) {
    let db = inbox_db("inbox_static");
    let broker = support::broker();
    if broker.mock_cluster().is_some() {
        eprintln!(
            "mock cluster: it implements no static membership; needs a real broker (WALBOX_TEST_KAFKA=apache); skipped"
        );
        return;
    }
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 4).expect("topic");
    let brokers = broker.bootstrap_servers();
    let group = format!("g_{}", db.name);
    let mut bursts = Bursts::new();
    // A dynamic member that died is waited for up to the session timeout: 45 s here, so that
    // a restart that waits for it cannot pass for a fast one.
    let env = |port: u16, instance: &str| {
        form.env(inbox_env(
            &db,
            &brokers,
            &group,
            &topic,
            port,
            &[
                ("WALBOX_INBOX_KAFKA_GROUP_INSTANCE_ID", instance),
                ("WALBOX_INBOX_KAFKA_PROPERTY_SESSION_TIMEOUT_MS", "45000"),
            ],
        ))
    };

    let port_a = free_port();
    let mut a = Walbox::spawn_subcommand("inbox", &env(port_a, "inbox-a"));
    wait_metric(port_a, ASSIGNED, 4.0, &a);
    let port_b = free_port();
    let b = Walbox::spawn_subcommand("inbox", &env(port_b, "inbox-b"));
    wait_metric(port_b, ASSIGNED, 2.0, &b);
    wait_metric(port_a, ASSIGNED, 2.0, &a);
    produce(&brokers, &topic, &bursts.take(200));
    wait_until(WAIT, "every effect with two members", || {
        effects(&db) == bursts.total.get()
    });
    let b_revoked = metric(port_b, REVOKED).expect("b's metrics");

    for stop in [Stop::Kill, Stop::Term] {
        match stop {
            Stop::Term => {
                a.terminate();
                assert!(a.wait_exit(WAIT).success(), "{}", a.log());
            }
            Stop::Kill => a.kill(),
        }
        // Records for every partition wait while the first member is down: the second member
        // processes its own, the first member's wait for it.
        let before = bursts.total.get();
        produce(&brokers, &topic, &bursts.take(200));
        let restarted = Instant::now();
        let port_a = free_port();
        a = Walbox::spawn_subcommand("inbox", &env(port_a, "inbox-a"));
        wait_until(WAIT, "every effect after the restart", || {
            effects(&db) == bursts.total.get()
        });
        let stall = restarted.elapsed();
        eprintln!("static member restarted after {stop:?}: every record processed {stall:?} after the restart ({} records)", bursts.total.get() - before);
        assert!(
            stall <= RESTART_STALL_MAX,
            "after {stop:?}, the restarted static member took {stall:?} (> {RESTART_STALL_MAX:?}) to process its partitions; its log:\n{}",
            a.log()
        );
        // No rebalance: the second member neither gained nor lost a partition.
        assert_eq!(metric(port_a, ASSIGNED), Some(2.0), "{}", a.log());
        assert_eq!(metric(port_b, ASSIGNED), Some(2.0), "{}", b.log());
        assert_eq!(
            metric(port_b, REVOKED),
            Some(b_revoked),
            "the second member was rebalanced by the first one's restart after {stop:?}:\n{}",
            b.log()
        );
    }
    a.terminate();
    assert!(a.wait_exit(WAIT).success(), "{}", a.log());
    assert_exactly_once(&db, bursts.total.get());
    assert_applied_in_order(&db);
}

both_forms!(
    a_live_rebalance_moves_only_the_partitions_that_change_owner,
    a_restarted_static_member_gets_its_partitions_back_without_a_rebalance,
);
