//! Tests of the sandbox cluster: every authentication method, TLS, restarts, cleanup.

use super::*;
use tokio_postgres::NoTls;

#[tokio::test]
async fn serves_sql_over_socket_and_tcp_with_every_auth_method() {
    let pg = PgCluster::start(PgClusterOptions::default()).expect("start cluster");
    pg.create_database("walbox test").unwrap();
    assert_eq!(
        pg.psql("walbox test", "SHOW wal_level").unwrap(),
        "logical\n"
    );
    let sql = "CREATE TABLE t (v int);\nINSERT INTO t VALUES (41), (1);\nSELECT sum(v) FROM t;";
    assert_eq!(pg.psql("walbox test", sql).unwrap(), "42\n");
    let err = pg.psql("postgres", "SELECT nope;").unwrap_err().to_string();
    assert!(err.contains("nope") && !err.contains('\n'), "{err}");

    let db = "walbox test";
    let roles = [MD5_ROLE, PLAIN_ROLE, NOPRIVS_ROLE];
    let mut urls: Vec<_> = roles
        .iter()
        .map(|(r, pw)| (pg.role_url(r, pw, db), *r))
        .collect();
    urls.extend([(pg.url(db), SUPERUSER), (pg.socket_url(db), SUPERUSER)]);
    for (url, role) in &urls {
        let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect(url);
        tokio::spawn(conn);
        let row = client
            .query_one("SELECT current_user::text", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), *role);
    }
    let wrong = pg.role_url(SUPERUSER, "wrong", "postgres");
    assert!(tokio_postgres::connect(&wrong, NoTls).await.is_err());
    let mut libpq = pg.command("psql"); // libpq takes the socket URL too
    libpq
        .args(["-XAtc", "SELECT 1"])
        .arg(pg.socket_url("postgres"));
    assert_eq!(run(libpq, "psql").unwrap().stdout, b"1\n");

    pg.restart().unwrap();
    pg.stop().unwrap();
    assert!(pg.psql("postgres", "SELECT 1").is_err());
    pg.start_again().unwrap();
    assert_eq!(pg.psql("postgres", "SELECT 1").unwrap(), "1\n");
    let dir = pg.root.clone();
    drop(pg);
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[tokio::test]
async fn applies_ssl_settings_and_wal_segsize() {
    let pg = PgCluster::start(PgClusterOptions {
        wal_segsize_mb: Some(1),
        settings: vec![("wal_sender_timeout".into(), "7s".into())],
        ssl: true,
        watchdog: true,
        major: None,
    })
    .expect("start cluster");
    let show = pg.psql(
        "postgres",
        "SHOW ssl; SHOW wal_segment_size; SHOW wal_sender_timeout;",
    );
    assert_eq!(show.unwrap(), "on\n1MB\n7s\n");

    let mut tls = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls()).unwrap();
    tls.set_ca_file(pg.ca_cert().unwrap()).unwrap();
    let tls = postgres_openssl::MakeTlsConnector::new(tls.build());
    for host in ["127.0.0.1", "localhost"] {
        let url = pg
            .url("postgres")
            .replace("disable", "require")
            .replace("127.0.0.1", host);
        let (client, conn) = tokio_postgres::connect(&url, tls.clone())
            .await
            .expect(&url);
        tokio::spawn(conn);
        let sql = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";
        assert!(client.query_one(sql, &[]).await.unwrap().get::<_, bool>(0));
    }
}
