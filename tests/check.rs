//! `walbox check`: each check made to fail (or warn) on a real PostgreSQL and the mock cluster,
//! asserting its line, its fix and the exit status; one run where everything passes; the JSON
//! shape.

use std::str::FromStr;
use std::sync::OnceLock;

use walbox::config::conninfo::ConnInfo;
use walbox::sandbox::postgres::{PgCluster, PgClusterOptions, MD5_ROLE, NOPRIVS_ROLE};
use walbox::source::replication::ReplicationConnection;

use crate::support::{self, free_port, wait_until, walbox_env, TestDb, Walbox, WAIT};

/// Exit status of `walbox check` when a check failed.
const CHECKS_FAILED: i32 = 13;

/// The output of one `walbox check` run.
pub(crate) struct Run {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    /// The line of check `name`, panicking with the whole output when there is none.
    pub(crate) fn line(&self, name: &str) -> &str {
        self.stdout
            .lines()
            .find(|l| {
                // The status label is 7 wide ("skipped"), then two spaces.
                l.get(9..).is_some_and(|rest| {
                    rest.starts_with(name) && rest[name.len()..].starts_with("  ")
                })
            })
            .unwrap_or_else(|| panic!("no line for check {name:?} in:\n{}", self.stdout))
    }

    /// Asserts that check `name` has `status` and that its line contains each of `parts`.
    pub(crate) fn expect(&self, name: &str, status: &str, parts: &[&str]) {
        let line = self.line(name);
        assert!(
            line.split_whitespace().next() == Some(status),
            "check {name:?} is not {status}:\n{}",
            self.stdout
        );
        for part in parts {
            assert!(line.contains(part), "{part:?} missing from: {line}");
        }
    }

    pub(crate) fn failed(&self) {
        assert_eq!(
            self.code,
            Some(CHECKS_FAILED),
            "exit status; stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        assert!(
            self.stderr.contains("checks failed"),
            "stderr: {}",
            self.stderr
        );
    }

    pub(crate) fn passed(&self) {
        assert_eq!(
            self.code,
            Some(0),
            "exit status; stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
    }
}

/// `walbox check` (with `args`) with exactly `env`.
pub(crate) fn check(env: &[(String, String)], args: &[&str]) -> Run {
    let args: Vec<&str> = std::iter::once("check")
        .chain(args.iter().copied())
        .collect();
    let out = support::walbox_output(&args, env);
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub(crate) fn with(
    mut env: Vec<(String, String)>,
    key: &str,
    value: &str,
) -> Vec<(String, String)> {
    env.retain(|(k, _)| k != key);
    env.push((key.to_owned(), value.to_owned()));
    env
}

/// A cluster that bounds WAL kept for slots, so that nothing warns.
fn bounded_cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        support::start_cluster(PgClusterOptions {
            settings: vec![("max_slot_wal_keep_size".into(), "1GB".into())],
            ..support::pg_options()
        })
    })
}

/// A cluster with `wal_level = replica`, its one replication slot taken (by a physical slot)
/// and its one walsender busy (a replication connection held open for the test run).
fn tight_db() -> &'static TestDb {
    static DB: OnceLock<TestDb> = OnceLock::new();
    DB.get_or_init(|| {
        let cluster: &'static PgCluster =
            Box::leak(Box::new(support::start_cluster(PgClusterOptions {
                settings: [
                    ("wal_level", "replica"),
                    ("max_replication_slots", "1"),
                    ("max_wal_senders", "1"),
                ]
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
                ..support::pg_options()
            })));
        let db = TestDb::on(cluster, "tight");
        db.sql("SELECT pg_create_physical_replication_slot('taken')");
        let info = ConnInfo::from_str(&db.url()).expect("conninfo");
        let (held, connected) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let conn = ReplicationConnection::connect(&info).await;
                let _ = held.send(conn.is_ok());
                // Held until the test binary exits.
                std::future::pending::<()>().await;
                drop(conn);
            });
        });
        assert!(connected.recv().unwrap(), "hold a walsender");
        wait_until(WAIT, "the walsender to be counted", || {
            db.sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'") == "1"
        });
        db
    })
}

#[test]
fn everything_passes_on_a_ready_database_and_broker() {
    let db = TestDb::on(bounded_cluster(), "check_green");
    db.create_slot_and_publication(&db.name);
    let broker = support::broker();
    let env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    let run = check(&env, &[]);
    run.passed();
    // The mock cluster does not answer DescribeConfigs: the progress topic's policy warns.
    let policy = "progress topic cleanup.policy";
    let mock = broker.mock_cluster().is_some();
    for line in run
        .stdout
        .lines()
        .filter(|l| !(l.contains(" checks: ") || mock && l.contains(policy)))
    {
        assert!(line.starts_with("ok    "), "not ok: {line}\n{}", run.stdout);
    }
    if mock {
        run.expect(
            policy,
            "WARN",
            &["cannot read the configuration", "DescribeConfigs"],
        );
    } else {
        run.expect(policy, "ok", &["cleanup.policy=compact"]);
    }
    run.expect("postgres", "ok", &["connected to postgresql://walbox:***@"]);
    run.expect("wal_level", "ok", &["logical"]);
    run.expect("role", "ok", &["walbox is a superuser"]);
    run.expect("outbox table public.outbox", "ok", &["payload jsonb"]);
    run.expect("select on public.outbox", "ok", &[]);
    run.expect("publication", "ok", &["inserts only"]);
    run.expect("slot", "ok", &["pgoutput, not held"]);
    run.expect("max_slot_wal_keep_size", "ok", &["1024 MiB"]);
    // The mock cluster has three brokers; an external one has its own count.
    let brokers = if broker.mock_cluster().is_some() {
        "answers: 3 brokers"
    } else {
        "answers: "
    };
    run.expect("kafka brokers", "ok", &[brokers]);
    run.expect("topic walbox.progress", "ok", &["exists, partitions: 1"]);
    run.expect("idempotent producer", "ok", &["assigned"]);
    assert!(run.stdout.contains(" 0 failed"), "{}", run.stdout);
    let password = bounded_cluster().password();
    assert!(!run.stdout.contains(password) && !run.stderr.contains(password));
}

#[test]
fn json_lists_every_check_and_unlimited_wal_keep_size_warns_without_failing() {
    let db = TestDb::new("check_json");
    db.create_slot_and_publication(&db.name);
    let broker = support::broker();
    let env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    let run = check(&env, &["--json"]);
    run.passed();
    let v: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON on stdout");
    assert_eq!(v["passed"], true);
    let checks = v["checks"].as_array().expect("checks");
    assert!(checks.len() >= 12, "{v:#}");
    for c in checks {
        let obj = c.as_object().unwrap();
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["detail", "fix", "name", "status"], "{c}");
        assert!(["ok", "warn", "fail", "skipped"].contains(&c["status"].as_str().unwrap()));
        assert_eq!(
            c["fix"].is_string(),
            c["status"] == "warn" || c["status"] == "fail",
            "a fix exactly for warnings and failures: {c}"
        );
    }
    let keep = checks
        .iter()
        .find(|c| c["name"] == "max_slot_wal_keep_size")
        .unwrap();
    assert_eq!(keep["status"], "warn", "{keep}");
    assert!(keep["detail"].as_str().unwrap().contains("unlimited"));
    assert!(keep["fix"]
        .as_str()
        .unwrap()
        .starts_with("ALTER SYSTEM SET max_slot_wal_keep_size = "));
}

#[test]
fn a_wrong_password_or_a_server_down_is_a_failed_check_without_the_secret() {
    let db = TestDb::new("check_conn");
    let broker = support::broker();
    let secret = "not-the-password-7f3a";
    let url = support::cluster().role_url("walbox", secret, &db.name);
    let env = with(
        walbox_env(&db, &db.name, &broker.bootstrap_servers()),
        "WALBOX_POSTGRES_URL",
        &url,
    );
    let run = check(&env, &[]);
    run.failed();
    run.expect(
        "postgres",
        "FAIL",
        &[
            "28P01",
            "postgresql://walbox:***@127.0.0.1",
            "fix: check the user and the password in postgres.url",
        ],
    );
    run.expect("wal_level", "skipped", &["not checked: postgres failed"]);
    run.expect("slot", "skipped", &[]);
    run.expect("kafka brokers", "ok", &[]);
    assert!(!run.stdout.contains(secret) && !run.stderr.contains(secret));

    let down = format!(
        "postgres://walbox:{secret}@127.0.0.1:{}/{}?sslmode=disable",
        free_port(),
        db.name
    );
    let run = check(&with(env, "WALBOX_POSTGRES_URL", &down), &[]);
    run.failed();
    run.expect(
        "postgres",
        "FAIL",
        &["fix: check that PostgreSQL runs and that postgres.url's host and port reach it"],
    );
    assert!(!run.stdout.contains(secret) && !run.stderr.contains(secret));
}

#[test]
fn wal_level_replica_fails_with_its_setting() {
    let db = tight_db();
    let broker = support::broker();
    let run = check(&walbox_env(db, &db.name, &broker.bootstrap_servers()), &[]);
    run.failed();
    run.expect(
        "wal_level",
        "FAIL",
        &[
            "wal_level is \"replica\" on the primary",
            "fix: ALTER SYSTEM SET wal_level = 'logical'; then restart PostgreSQL",
        ],
    );
    run.expect("slot", "FAIL", &["cannot be created: wal_level failed"]);
}

#[test]
fn no_free_replication_slot_fails_and_the_slot_cannot_be_created() {
    let db = tight_db();
    let broker = support::broker();
    let run = check(&walbox_env(db, &db.name, &broker.bootstrap_servers()), &[]);
    run.failed();
    run.expect(
        "max_replication_slots",
        "FAIL",
        &[
            "all 1 replication slots are in use",
            "fix: ALTER SYSTEM SET max_replication_slots = 2; then restart PostgreSQL",
        ],
    );
    run.expect("slot", "FAIL", &["max_replication_slots failed; fix:"]);
}

#[test]
fn no_free_walsender_fails_with_its_setting() {
    let db = tight_db();
    let broker = support::broker();
    let run = check(&walbox_env(db, &db.name, &broker.bootstrap_servers()), &[]);
    run.failed();
    run.expect(
        "max_wal_senders",
        "FAIL",
        &[
            "all 1 walsenders are in use",
            "fix: ALTER SYSTEM SET max_wal_senders = 2; then restart PostgreSQL",
        ],
    );
    run.expect(
        "replication connection",
        "FAIL",
        &["53300", "fix: free a walsender or raise max_wal_senders"],
    );
}

#[test]
fn a_standby_that_cannot_decode_fails_the_server_check() {
    let (shared, _exclusive) = support::standby::clusters();
    let db = TestDb::new("check_standby");
    let broker = support::broker();
    let env = with(
        walbox_env(&db, &db.name, &broker.bootstrap_servers()),
        "WALBOX_POSTGRES_URL",
        &shared.no_feedback.url("postgres"),
    );
    let run = check(&env, &[]);
    run.failed();
    run.expect(
        "server",
        "FAIL",
        &[
            "hot_standby_feedback is off on the standby",
            "fix: on the standby: ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf();",
        ],
    );
}

#[test]
fn a_role_without_replication_fails_and_cannot_create_the_slot() {
    let db = TestDb::new("check_role");
    let broker = support::broker();
    let (role, password) = NOPRIVS_ROLE;
    let url = support::cluster().role_url(role, password, &db.name);
    let env = with(
        walbox_env(&db, &db.name, &broker.bootstrap_servers()),
        "WALBOX_POSTGRES_URL",
        &url,
    );
    let run = check(&env, &[]);
    run.failed();
    run.expect(
        "role",
        "FAIL",
        &[
            "walbox_noprivs has neither REPLICATION nor superuser",
            "fix: ALTER ROLE \"walbox_noprivs\" REPLICATION;",
        ],
    );
    run.expect(
        "replication connection",
        "FAIL",
        &[
            // The server's words differ between majors; its SQLSTATE does not.
            "FATAL 42501",
            "fix: ALTER ROLE \"walbox_noprivs\" REPLICATION;",
        ],
    );
    run.expect("slot", "FAIL", &["cannot be created: role failed"]);
    assert!(!run.stdout.contains(password) && !run.stderr.contains(password));
}

#[test]
fn a_role_without_select_on_the_outbox_or_the_right_to_create_the_publication_fails() {
    let db = TestDb::new("check_select");
    let broker = support::broker();
    let (role, password) = MD5_ROLE;
    let url = support::cluster().role_url(role, password, &db.name);
    let env = with(
        walbox_env(&db, &db.name, &broker.bootstrap_servers()),
        "WALBOX_POSTGRES_URL",
        &url,
    );
    let run = check(&env, &[]);
    run.failed();
    run.expect("role", "ok", &["walbox_md5 has REPLICATION"]);
    run.expect(
        "select on public.outbox",
        "FAIL",
        &[
            "walbox_md5 lacks SELECT on public.outbox",
            "fix: GRANT SELECT ON \"public\".\"outbox\" TO \"walbox_md5\";",
        ],
    );
    // Nor may it create the publication (postgres.create_publication is on).
    run.expect(
        "publication",
        "FAIL",
        &[
            "walbox cannot create it: walbox_md5 lacks CREATE on the database; walbox_md5 does not own public.outbox",
            "fix: create it as the tables' owner: CREATE PUBLICATION",
        ],
    );
}

#[test]
fn a_missing_publication_fails_with_the_statement_that_creates_it() {
    let db = TestDb::new("check_nopub");
    let broker = support::broker();
    let env = with(
        walbox_env(&db, &db.name, &broker.bootstrap_servers()),
        "WALBOX_POSTGRES_CREATE_PUBLICATION",
        "false",
    );
    let run = check(&env, &[]);
    run.failed();
    run.expect(
        "publication",
        "FAIL",
        &[
            &format!("publication {:?} does not exist", db.name),
            &format!(
                "fix: CREATE PUBLICATION \"{}\" FOR TABLE \"public\".\"outbox\" WITH (publish = 'insert');",
                db.name
            ),
        ],
    );
}

#[test]
fn a_publication_of_other_tables_or_other_changes_fails_with_each_fix() {
    let db = TestDb::new("check_pub");
    let broker = support::broker();
    db.sql(&format!(
        "CREATE PUBLICATION {} FOR TABLE payments WITH (publish = 'insert, update')",
        db.name
    ));
    let run = check(&walbox_env(&db, &db.name, &broker.bootstrap_servers()), &[]);
    run.failed();
    let p = format!("\"{}\"", db.name);
    run.expect(
        "publication",
        "FAIL",
        &[
            "does not publish \"public\".\"outbox\"",
            "also publishes \"public\".\"payments\", which is not an outbox table",
            "publishes update besides insert",
            &format!("fix: ALTER PUBLICATION {p} ADD TABLE \"public\".\"outbox\"; ALTER PUBLICATION {p} DROP TABLE \"public\".\"payments\"; ALTER PUBLICATION {p} SET (publish = 'insert');"),
            // Adding the table back does not bring back what the slot skipped meanwhile.
            "republish the rows committed meanwhile: walbox republish --since",
        ],
    );

    db.sql(&format!(
        "DROP PUBLICATION {0}; CREATE PUBLICATION {0} FOR ALL TABLES WITH (publish = 'insert')",
        db.name
    ));
    let run = check(&walbox_env(&db, &db.name, &broker.bootstrap_servers()), &[]);
    run.failed();
    run.expect(
        "publication",
        "FAIL",
        &[
            "is FOR ALL TABLES",
            &format!(
                "CREATE PUBLICATION \"{}_outbox\" FOR TABLE \"public\".\"outbox\" WITH (publish = 'insert');",
                db.name
            ),
        ],
    );
}

#[test]
fn a_missing_slot_that_may_not_be_created_fails_with_the_statement() {
    let db = TestDb::new("check_noslot");
    let broker = support::broker();
    let env = with(
        walbox_env(&db, &db.name, &broker.bootstrap_servers()),
        "WALBOX_POSTGRES_CREATE_SLOT",
        "false",
    );
    let run = check(&env, &[]);
    run.failed();
    run.expect(
        "slot",
        "FAIL",
        &[&format!(
            "fix: SELECT pg_create_logical_replication_slot('{}', 'pgoutput'); (or set postgres.create_slot = true)",
            db.name
        )],
    );
}

#[test]
fn a_slot_of_another_plugin_fails() {
    let db = TestDb::new("check_plugin");
    let broker = support::broker();
    db.sql(&format!(
        "SELECT pg_create_logical_replication_slot('{}', 'test_decoding')",
        db.name
    ));
    let run = check(&walbox_env(&db, &db.name, &broker.bootstrap_servers()), &[]);
    run.failed();
    run.expect(
        "slot",
        "FAIL",
        &[
            "its output plugin is \"test_decoding\"; walbox needs pgoutput",
            &format!("SELECT pg_drop_replication_slot('{}');", db.name),
        ],
    );
}

#[test]
fn a_slot_held_by_another_process_names_it() {
    let db = TestDb::new("check_held");
    let broker = support::broker();
    let env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    let _running = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    let pid = db.sql(&format!(
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{}'",
        db.name
    ));
    let run = check(&env, &[]);
    run.failed();
    run.expect(
        "slot",
        "FAIL",
        &[
            &format!("is held by pid {pid} (application_name \"walbox\", client 127.0.0.1)"),
            &format!("SELECT pg_terminate_backend({pid});"),
        ],
    );
}

#[test]
fn a_lost_slot_fails_with_the_way_out() {
    // 1 MB segments and 2 MB kept for slots: a few MB of WAL and a checkpoint lose the slot.
    let cluster: &'static PgCluster =
        Box::leak(Box::new(support::start_cluster(PgClusterOptions {
            wal_segsize_mb: Some(1),
            settings: [("max_slot_wal_keep_size", "2MB"), ("min_wal_size", "4MB")]
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..support::pg_options()
        })));
    let db = TestDb::on(cluster, "check_lost");
    db.create_slot_and_publication(&db.name);
    db.sql("CREATE TABLE ballast (x text)");
    wait_until(WAIT, "the slot to be lost", || {
        db.sql("INSERT INTO ballast SELECT repeat(md5(g::text), 32) FROM generate_series(1, 3000) g; CHECKPOINT;");
        db.sql(&format!(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = '{}'",
            db.name
        )) == "lost"
    });
    let broker = support::broker();
    let run = check(&walbox_env(&db, &db.name, &broker.bootstrap_servers()), &[]);
    run.failed();
    run.expect(
        "slot",
        "FAIL",
        &[
            "is lost (wal_status = lost",
            "fix: walbox recreate-slot --confirm-data-loss, then the walbox republish it prints",
        ],
    );
    run.expect("max_slot_wal_keep_size", "ok", &["2 MiB"]);
}

#[test]
fn mapped_columns_must_exist_with_usable_types() {
    let db = TestDb::new("check_mapping");
    let broker = support::broker();
    let env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    let run = check(
        &with(env.clone(), "WALBOX_OUTBOX_COLUMNS_AGGREGATE_ID", "account"),
        &[],
    );
    run.failed();
    run.expect(
        "outbox table public.outbox",
        "FAIL",
        &[
            "outbox table public.outbox has no column \"account\"",
            "fix: set outbox.columns.aggregate_id to a column of public.outbox",
        ],
    );

    let wrong_types = with(env.clone(), "WALBOX_OUTBOX_COLUMNS_TIMESTAMP", "id");
    let run = check(
        &with(wrong_types, "WALBOX_OUTBOX_COLUMNS_PARTITION", "payload"),
        &[],
    );
    run.failed();
    run.expect(
        "outbox table public.outbox",
        "FAIL",
        &[
            "column \"id\" (outbox.columns.timestamp) is bigint, not a timestamp",
            "column \"payload\" (outbox.columns.partition) is jsonb, not an integer",
            "fix: set outbox.columns.timestamp to a timestamptz column",
        ],
    );

    // A text column may hold timestamps: a warning, not a failure.
    let run = check(
        &with(env, "WALBOX_OUTBOX_COLUMNS_TIMESTAMP", "event_type"),
        &[],
    );
    run.expect(
        "outbox table public.outbox",
        "WARN",
        &[
            "column \"event_type\" (outbox.columns.timestamp) is text",
            "fix: ALTER TABLE \"public\".\"outbox\" ALTER COLUMN \"event_type\" TYPE timestamptz",
        ],
    );
}

#[test]
fn a_failover_slot_needs_17_and_synchronized_standby_slots() {
    let db = TestDb::new("check_failover");
    let broker = support::broker();
    db.create_slot_and_publication(&db.name);
    let env = with(
        walbox_env(&db, &db.name, &broker.bootstrap_servers()),
        "WALBOX_POSTGRES_FAILOVER_SLOT",
        "true",
    );
    let run = check(&env, &[]);
    if support::major() < 17 {
        run.failed();
        run.expect(
            "failover slot",
            "FAIL",
            &[
                "needs PostgreSQL 17 or newer",
                "set postgres.failover_slot = false",
            ],
        );
    } else {
        // The shared cluster has no standby, so nothing names one in synchronized_standby_slots.
        run.expect(
            "failover slot",
            "WARN",
            &[
                "walbox makes the slot a failover slot at start",
                "synchronized_standby_slots is empty",
                "ALTER SYSTEM SET synchronized_standby_slots",
            ],
        );
    }
}

#[test]
fn retention_says_what_it_will_do_or_which_grant_it_lacks() {
    let db = TestDb::new("check_retention");
    db.create_slot_and_publication(&db.name);
    let broker = support::broker();
    let env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    let env = with(env, "WALBOX_OUTBOX_RETENTION_ENABLED", "true");
    let env = with(env, "WALBOX_OUTBOX_RETENTION_KEEP", "7d");
    let env = with(env, "WALBOX_OUTBOX_RETENTION_COLUMN", "created_at");
    let run = check(&env, &[]);
    run.expect(
        "retention on public.outbox",
        "ok",
        &["deletes rows older than 7d in batches of 5000"],
    );

    // A role that may read the outbox but not delete from it: retention would fail every pass.
    let (role, password) = MD5_ROLE;
    db.sql(&format!("GRANT SELECT ON outbox TO {role}"));
    let url = support::cluster().role_url(role, password, &db.name);
    let run = check(&with(env, "WALBOX_POSTGRES_URL", &url), &[]);
    run.expect(
        "retention on public.outbox",
        "WARN",
        &[
            &format!("{role} lacks SELECT or DELETE on public.outbox"),
            &format!("fix: GRANT SELECT, DELETE ON public.outbox TO \"{role}\";"),
        ],
    );
}
