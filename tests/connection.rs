//! PostgreSQL connections against the real server: every authentication method, every TLS mode,
//! both connection kinds (our replication client and the tokio-postgres control connection), the
//! exit statuses of the binary when connecting fails, and two replication-protocol details (a
//! busy slot's SQLSTATE, and what a status update confirms).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::PKey;
use openssl::x509::extension::{BasicConstraints, KeyUsage};
use openssl::x509::{X509Name, X509};
use walbox::config::conninfo::ConnInfo;
use walbox::lsn::Lsn;
use walbox::pg::auth::StartupError;
use walbox::pg::control::{connect_control, ConnectError};
use walbox::pg::tls::TlsError;
use walbox::sandbox::postgres::{
    PgCluster, PgClusterOptions, MD5_ROLE, NOPRIVS_ROLE, PLAIN_ROLE, SUPERUSER,
};
use walbox::source::pgoutput::{self, LogicalMessage};
use walbox::source::replication::{
    ReplicationConnection, ReplicationError, ReplicationMessage, StandbyStatus,
};

use crate::support::{self, cluster, unique, walbox_env, TestDb, Walbox, WAIT};

/// Bound on a walbox run that must fail at start-up (it normally exits within a second).
const EXIT_WAIT: Duration = Duration::from_secs(20);

/// A name that resolves to 127.0.0.1 (glibc's `inet_aton` form) but matches neither SAN of the
/// sandbox certificate (`localhost`, IP `127.0.0.1`): verify-ca accepts it, verify-full must not.
const MISMATCHED_HOST: &str = "127.1";

/// A key=value connection string to the shared cluster over TCP.
fn tcp(
    (user, password): (&str, &str),
    db: &str,
    host: &str,
    sslmode: &str,
    root: Option<&Path>,
) -> ConnInfo {
    let mut s = format!(
        "host={host} port={} user={user} password='{password}' dbname='{db}' sslmode={sslmode} \
         connect_timeout=10",
        cluster().port()
    );
    if let Some(root) = root {
        s.push_str(&format!(" sslrootcert='{}'", root.display()));
    }
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// A second cluster, started on first use, that does not serve TLS at all (the shared one does).
fn cluster_without_tls() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        support::start_cluster(PgClusterOptions {
            ssl: false,
            ..support::pg_options()
        })
    })
}

fn superuser() -> (&'static str, &'static str) {
    (SUPERUSER, cluster().password())
}

fn sandbox_ca() -> &'static Path {
    cluster().ca_cert().expect("the shared cluster serves TLS")
}

fn parse(s: &str) -> ConnInfo {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// A self-signed CA that did not sign the server certificate, with the same subject name as the
/// sandbox CA (so only the signature can tell them apart), written as PEM into a new directory.
fn foreign_ca() -> (tempfile::TempDir, PathBuf) {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    let key = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
    let mut name = X509Name::builder().unwrap();
    name.append_entry_by_nid(Nid::COMMONNAME, "walbox sandbox CA")
        .unwrap();
    let name = name.build();
    let mut serial = BigNum::new().unwrap();
    serial.rand(127, MsbOption::MAYBE_ZERO, false).unwrap();
    let mut cert = X509::builder().unwrap();
    cert.set_version(2).unwrap();
    cert.set_serial_number(serial.to_asn1_integer().unwrap().as_ref())
        .unwrap();
    cert.set_subject_name(&name).unwrap();
    cert.set_issuer_name(&name).unwrap();
    cert.set_pubkey(&key).unwrap();
    cert.set_not_before(Asn1Time::days_from_now(0).unwrap().as_ref())
        .unwrap();
    cert.set_not_after(Asn1Time::days_from_now(30).unwrap().as_ref())
        .unwrap();
    cert.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
        .unwrap();
    cert.append_extension(
        KeyUsage::new()
            .critical()
            .key_cert_sign()
            .crl_sign()
            .build()
            .unwrap(),
    )
    .unwrap();
    cert.sign(&key, MessageDigest::sha256()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("foreign-ca.pem");
    std::fs::write(&path, cert.build().to_pem().unwrap()).unwrap();
    (dir, path)
}

/// `(user, backend_type, ssl)` of backend `pid`, seen from another connection.
fn backend(db: &TestDb, pid: i32) -> (String, String, bool) {
    let row = db.sql(&format!(
        "SELECT a.usename, a.backend_type, s.ssl FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) WHERE pid = {pid}"
    ));
    let f: Vec<&str> = row.split('|').collect();
    assert_eq!(f.len(), 3, "no backend {pid}: {row:?}");
    (f[0].to_owned(), f[1].to_owned(), f[2] == "t")
}

/// Connects a replication connection, runs IDENTIFY_SYSTEM, and checks on another connection
/// that the backend is a walsender of `user`, with TLS iff `tls`.
async fn assert_replication_connects(db: &TestDb, info: &ConnInfo, user: &str, tls: bool) {
    let what = info.redacted();
    let mut conn = ReplicationConnection::connect(info)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let id = conn
        .identify_system()
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(id.dbname.as_deref(), Some(db.name.as_str()), "{what}");
    assert!(id.timeline >= 1 && id.xlogpos > Lsn::ZERO, "{what}: {id:?}");
    assert_eq!(
        id.system_id,
        db.sql("SELECT system_identifier FROM pg_control_system()"),
        "{what}"
    );
    let pid = conn.backend_pid().expect("BackendKeyData");
    assert_eq!(
        backend(db, pid),
        (user.to_owned(), "walsender".to_owned(), tls),
        "{what}: (user, backend type, TLS)"
    );
    conn.close().await.unwrap();
}

/// The TLS handshake error of a replication connection that must fail verification.
async fn replication_tls_failure(info: &ConnInfo) -> String {
    match ReplicationConnection::connect(info).await {
        Err(ReplicationError::Startup(StartupError::Tls(TlsError::CertificateRejected(msg)))) => {
            msg
        }
        Err(e) => panic!(
            "{}: expected a TLS handshake error, got {e}",
            info.redacted()
        ),
        Ok(_) => panic!("{}: connected despite verification", info.redacted()),
    }
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Library level: authentication methods
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn trust_over_the_unix_socket_never_uses_tls() {
    let db = TestDb::new("conn_trust");
    let url = cluster().socket_url(&db.name);
    assert_replication_connects(&db, &parse(&url), SUPERUSER, false).await;
    // sslmode is ignored on a Unix socket (libpq's rule), even verify-full.
    let strict = format!("{url}?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem");
    assert_replication_connects(&db, &parse(&strict), SUPERUSER, false).await;
}

#[tokio::test]
async fn md5_role_authenticates_and_a_wrong_password_is_28p01() {
    let db = TestDb::new("conn_md5");
    let ok = tcp(MD5_ROLE, &db.name, "127.0.0.1", "disable", None);
    assert_replication_connects(&db, &ok, MD5_ROLE.0, false).await;
    let bad = tcp((MD5_ROLE.0, "nope"), &db.name, "127.0.0.1", "disable", None);
    let e = ReplicationConnection::connect(&bad).await.unwrap_err();
    assert_eq!(e.sqlstate(), Some("28P01"), "{e}");
}

#[tokio::test]
async fn cleartext_role_authenticates_and_needs_a_password() {
    let db = TestDb::new("conn_plain");
    let ok = tcp(PLAIN_ROLE, &db.name, "127.0.0.1", "disable", None);
    assert_replication_connects(&db, &ok, PLAIN_ROLE.0, false).await;
    let bad = tcp(
        (PLAIN_ROLE.0, "nope"),
        &db.name,
        "127.0.0.1",
        "disable",
        None,
    );
    let e = ReplicationConnection::connect(&bad).await.unwrap_err();
    assert_eq!(e.sqlstate(), Some("28P01"), "{e}");
    let none = parse(&format!(
        "host=127.0.0.1 port={} user={} dbname={} sslmode=disable",
        cluster().port(),
        PLAIN_ROLE.0,
        db.name
    ));
    let e = ReplicationConnection::connect(&none).await.unwrap_err();
    assert!(
        matches!(e, ReplicationError::Startup(StartupError::PasswordRequired)),
        "{e}"
    );
}

#[tokio::test]
async fn scram_superuser_over_tcp_and_a_wrong_password_is_28p01() {
    let db = TestDb::new("conn_scram");
    assert_replication_connects(&db, &parse(&db.url()), SUPERUSER, false).await;
    let bad = tcp((SUPERUSER, "nope"), &db.name, "127.0.0.1", "disable", None);
    let e = ReplicationConnection::connect(&bad).await.unwrap_err();
    assert_eq!(e.sqlstate(), Some("28P01"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Library level: TLS modes
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn every_tls_mode_really_uses_tls_over_tcp() {
    let db = TestDb::new("conn_tls");
    let ca = Some(sandbox_ca());
    let cases = [
        (superuser(), "prefer", "localhost", None),
        (superuser(), "require", "localhost", None),
        (superuser(), "verify-ca", "localhost", ca),
        // verify-ca does not check the name.
        (superuser(), "verify-ca", MISMATCHED_HOST, ca),
        (superuser(), "verify-full", "localhost", ca),
        // The IP address SAN matches too.
        (superuser(), "verify-full", "127.0.0.1", ca),
        // Password methods inside TLS.
        (MD5_ROLE, "verify-full", "localhost", ca),
        (PLAIN_ROLE, "require", "127.0.0.1", ca),
    ];
    for (role, mode, host, root) in cases {
        let info = tcp(role, &db.name, host, mode, root);
        assert_replication_connects(&db, &info, role.0, true).await;
    }
    let plain = tcp(superuser(), &db.name, "localhost", "disable", ca);
    assert_replication_connects(&db, &plain, SUPERUSER, false).await;
}

#[tokio::test]
async fn verification_failures_are_tls_errors() {
    let db = TestDb::new("conn_tls_bad");
    let (_dir, foreign) = foreign_ca();
    for mode in ["verify-full", "verify-ca", "require"] {
        // require with an sslrootcert verifies the chain like verify-ca (libpq's rule).
        let info = tcp(superuser(), &db.name, "localhost", mode, Some(&foreign));
        let msg = replication_tls_failure(&info).await;
        assert!(msg.contains("certificate"), "{mode}: {msg}");
    }
    let info = tcp(
        superuser(),
        &db.name,
        MISMATCHED_HOST,
        "verify-full",
        Some(sandbox_ca()),
    );
    let msg = replication_tls_failure(&info).await;
    assert!(msg.contains("hostname mismatch"), "{msg}");
    // prefer falls back to plaintext when verification fails, like libpq.
    let prefer = tcp(superuser(), &db.name, "localhost", "prefer", Some(&foreign));
    assert_replication_connects(&db, &prefer, SUPERUSER, false).await;
}

#[tokio::test]
async fn control_connection_follows_the_same_tls_rules() {
    let db = TestDb::new("conn_control");
    let ca = Some(sandbox_ca());
    let ssl_of = async |info: ConnInfo| -> bool {
        let client = connect_control(&info)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", info.redacted()));
        let row = client
            .query_one(
                "SELECT s.ssl, current_user::text FROM pg_stat_ssl s \
                 WHERE s.pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(1), info.user);
        row.get(0)
    };
    for (role, mode, host, root) in [
        (superuser(), "verify-full", "localhost", ca),
        (superuser(), "verify-full", "127.0.0.1", ca),
        (superuser(), "verify-ca", MISMATCHED_HOST, ca),
        (superuser(), "require", "localhost", None),
        (MD5_ROLE, "verify-full", "localhost", ca),
    ] {
        assert!(
            ssl_of(tcp(role, &db.name, host, mode, root)).await,
            "{mode}"
        );
    }
    assert!(!ssl_of(tcp(superuser(), &db.name, "localhost", "disable", ca)).await);
    assert!(!ssl_of(parse(&cluster().socket_url(&db.name))).await);

    let (_dir, foreign) = foreign_ca();
    for info in [
        tcp(
            superuser(),
            &db.name,
            "localhost",
            "verify-full",
            Some(&foreign),
        ),
        tcp(superuser(), &db.name, MISMATCHED_HOST, "verify-full", ca),
    ] {
        match connect_control(&info).await {
            Err(e @ ConnectError::Postgres(_)) => {
                assert_eq!(e.sqlstate(), None, "{e}");
                assert!(e.certificate_rejected(), "{e}");
                let msg = e.to_string();
                assert!(
                    msg.contains("certificate verify failed"),
                    "{}: {msg}",
                    info.redacted()
                );
            }
            Err(e) => panic!("{}: unexpected error {e}", info.redacted()),
            Ok(_) => panic!("{}: connected despite verification", info.redacted()),
        }
    }
}

#[tokio::test]
async fn a_server_without_tls_is_refused_under_require_and_used_in_plaintext_under_prefer() {
    let cluster = cluster_without_tls();
    let db = TestDb::on(cluster, "conn_notls");
    let url = |mode: &str| parse(&cluster.url(&db.name).replace("disable", mode));
    for mode in ["require", "verify-ca", "verify-full"] {
        match connect_control(&url(mode)).await {
            Err(ConnectError::Tls(TlsError::NotSupported(m))) => assert_eq!(m.as_str(), mode),
            Err(e) => panic!("{mode}: expected TlsError::NotSupported, got {e}"),
            Ok(_) => panic!("{mode}: connected without TLS"),
        }
        match ReplicationConnection::connect(&url(mode)).await {
            Err(ReplicationError::Startup(StartupError::Tls(TlsError::NotSupported(_)))) => {}
            Err(e) => panic!("{mode}: expected TlsError::NotSupported, got {e}"),
            Ok(_) => panic!("{mode}: connected without TLS"),
        }
    }
    connect_control(&url("prefer"))
        .await
        .expect("prefer falls back to plaintext");
}

// ---------------------------------------------------------------------------------------------
// Binary level: exit statuses and one-line errors
// ---------------------------------------------------------------------------------------------

/// walbox's environment for `db` with `postgres_url` as its connection string.
fn env_with_url(db: &TestDb, slot: &str, brokers: &str, url: String) -> Vec<(String, String)> {
    let mut env = walbox_env(db, slot, brokers);
    for (k, v) in &mut env {
        if k == "WALBOX_POSTGRES_URL" {
            *v = url.clone();
        }
    }
    env
}

/// Runs walbox with `url` until it exits; returns its exit code, last line (the one-line error)
/// and whole log.
fn run_until_exit(db: &TestDb, url: String) -> (Option<i32>, String, String) {
    let broker = support::broker();
    let env = env_with_url(db, &db.name, &broker.bootstrap_servers(), url);
    let mut walbox = Walbox::spawn(&env);
    let status = walbox.wait_exit(EXIT_WAIT);
    let line = walbox.last_line();
    assert!(
        line.starts_with("walbox: error: "),
        "not a one-line error: {line:?}"
    );
    (status.code(), line, walbox.log())
}

#[test]
fn wrong_password_exits_4_without_echoing_the_password() {
    let db = TestDb::new("conn_exit_pw");
    let secret = format!("Not-The-Password-{}", unique("pw"));
    let url = cluster().role_url(SUPERUSER, &secret, &db.name);
    let (code, line, log) = run_until_exit(&db, url);
    assert_eq!(code, Some(4), "{log}");
    assert!(line.contains("authentication"), "{line}");
    assert!(
        !log.contains(&secret),
        "the log contains the password:\n{log}"
    );
}

#[test]
fn role_without_replication_exits_4() {
    let db = TestDb::new("conn_exit_noprivs");
    let role = NOPRIVS_ROLE.0;
    // Everything but REPLICATION: the publication exists, the role can read the outbox.
    db.sql(&format!(
        "GRANT CONNECT ON DATABASE \"{db}\" TO {role};
         GRANT SELECT ON outbox TO {role};
         CREATE PUBLICATION \"{db}\" FOR TABLE outbox WITH (publish = 'insert');",
        db = db.name
    ));
    let url = cluster().role_url(role, NOPRIVS_ROLE.1, &db.name);
    let (code, line, log) = run_until_exit(&db, url);
    assert_eq!(code, Some(4), "{log}");
    assert!(line.contains("42501"), "{line}");
    assert!(
        !log.contains(NOPRIVS_ROLE.1),
        "the log contains the password"
    );
}

#[test]
fn untrusted_server_certificate_exits_4() {
    let db = TestDb::new("conn_exit_ca");
    let (_dir, foreign) = foreign_ca();
    let url = cluster()
        .url(&db.name)
        .replace("127.0.0.1", "localhost")
        .replace(
            "sslmode=disable",
            &format!("sslmode=verify-full&sslrootcert={}", foreign.display()),
        );
    let (code, line, log) = run_until_exit(&db, url);
    assert_eq!(code, Some(4), "{log}");
    assert!(line.contains("certificate"), "{line}");
}

#[test]
fn sslmode_require_against_a_server_without_tls_exits_4() {
    let cluster = cluster_without_tls();
    let db = TestDb::on(cluster, "conn_exit_notls");
    let url = cluster
        .url(&db.name)
        .replace("sslmode=disable", "sslmode=require");
    assert!(url.contains("sslmode=require"), "{url}");
    let (code, line, log) = run_until_exit(&db, url.clone());
    assert_eq!(code, Some(4), "{log}");
    assert!(
        line.contains("server does not support TLS") && line.contains("sslmode=require"),
        "{line}"
    );
    // walbox inbox connects through the same code: the same verdict.
    let env: Vec<(String, String)> = [
        ("WALBOX_INBOX_POSTGRES_URL", url.as_str()),
        ("WALBOX_INBOX_KAFKA_BROKERS", "127.0.0.1:9"),
        ("WALBOX_INBOX_KAFKA_GROUP_ID", "g"),
        ("WALBOX_INBOX_KAFKA_TOPICS", "t"),
        ("WALBOX_INBOX_HTTP_LISTEN", "off"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let mut inbox = Walbox::spawn_subcommand("inbox", &env);
    let status = inbox.wait_exit(EXIT_WAIT);
    assert_eq!(status.code(), Some(4), "{}", inbox.log());
    assert!(
        inbox.last_line().contains("server does not support TLS"),
        "{}",
        inbox.last_line()
    );
}

#[test]
fn missing_database_exits_5() {
    let db = TestDb::new("conn_exit_nodb");
    let missing = unique("no_such_db");
    let url = cluster().url(&missing);
    let (code, line, log) = run_until_exit(&db, url);
    assert_eq!(code, Some(5), "{log}");
    assert!(
        line.contains(&missing) && line.contains("does not exist"),
        "{line}"
    );
}

// ---------------------------------------------------------------------------------------------
// Replication protocol details
// ---------------------------------------------------------------------------------------------

fn options(publication: &str) -> [(&str, &str); 2] {
    [("proto_version", "1"), ("publication_names", publication)]
}

#[tokio::test]
async fn second_start_replication_on_an_active_slot_is_55006() {
    let db = TestDb::new("conn_busy");
    let slot = db.name.clone();
    db.create_slot_and_publication(&slot);
    let info = parse(&db.url());

    let first = ReplicationConnection::connect(&info).await.unwrap();
    let first = first
        .start_logical(&slot, Lsn::ZERO, &options(&slot))
        .await
        .unwrap();
    assert!(db.slot_active(&slot));

    let second = ReplicationConnection::connect(&info).await.unwrap();
    let e = second
        .start_logical(&slot, Lsn::ZERO, &options(&slot))
        .await
        .unwrap_err();
    assert_eq!(e.sqlstate(), Some("55006"), "{e}");

    // Once the first stream ends, the slot can be taken again.
    first.finish().await.unwrap();
    eventually("the slot to be released", || !db.slot_active(&slot)).await;
    let third = ReplicationConnection::connect(&info).await.unwrap();
    let third = third
        .start_logical(&slot, Lsn::ZERO, &options(&slot))
        .await
        .unwrap();
    third.finish().await.unwrap();
}

#[tokio::test]
async fn status_update_confirms_exactly_the_commit_end_lsn() {
    let db = TestDb::new("conn_status");
    let slot = db.name.clone();
    db.sql(&format!(
        "CREATE PUBLICATION \"{slot}\" FOR TABLE outbox WITH (publish = 'insert')"
    ));
    let mut conn = ReplicationConnection::connect(&parse(&db.url()))
        .await
        .unwrap();
    let consistent_point = conn.create_logical_slot(&slot, false).await.unwrap();
    assert_eq!(db.confirmed(&slot), consistent_point);

    db.sql(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
         VALUES ('a', 't', 'e', '{}'), ('b', 't', 'e', '{}')",
    );
    let mut stream = conn
        .start_logical(&slot, Lsn::ZERO, &options(&slot))
        .await
        .unwrap();
    let (mut inserts, mut commit) = (0, None);
    tokio::time::timeout(WAIT, async {
        while commit.is_none() {
            match stream.next().await.unwrap().expect("stream ended") {
                ReplicationMessage::XLogData { data, .. } => {
                    match pgoutput::decode(data).unwrap() {
                        LogicalMessage::Insert(_) => inserts += 1,
                        LogicalMessage::Commit(c) => commit = Some(c),
                        _ => {}
                    }
                }
                ReplicationMessage::Keepalive { .. } => {}
            }
        }
    })
    .await
    .expect("timed out waiting for the commit");
    let commit = commit.unwrap();
    assert_eq!(inserts, 2);
    assert!(
        commit.end_lsn > commit.commit_lsn && commit.commit_lsn > consistent_point,
        "{commit:?} after {consistent_point}"
    );
    // Receiving alone confirms nothing.
    assert_eq!(db.confirmed(&slot), consistent_point);

    let end = commit.end_lsn;
    stream
        .send_status(StandbyStatus {
            write: end,
            flush: end,
            apply: end,
            reply_requested: false,
        })
        .await
        .unwrap();
    eventually("confirmed_flush_lsn to move", || {
        db.confirmed(&slot) != consistent_point
    })
    .await;
    assert_eq!(db.confirmed(&slot), end);
    stream.finish().await.unwrap();
    // And it stays there after the stream ends.
    assert_eq!(db.confirmed(&slot), end);
}
