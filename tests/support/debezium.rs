//! The Debezium rig of the differential and migration tests: [`walbox::sandbox::debezium`]'s
//! Kafka Connect worker pointed at a [`TestDb`] of the shared cluster, and the walbox
//! configuration `walbox from-debezium` makes of its connector.
//!
//! Invariants: as [`walbox::sandbox::debezium`]'s; [`Connect::start`] panics with the end of
//! Connect's log instead of returning an error, and returns once the slot streams.

use std::fs;
use std::ops::{Deref, DerefMut};

use walbox::sandbox::debezium as rig;
pub use walbox::sandbox::debezium::rss_kib;

use super::TestDb;

/// The installed version's directory, or why it is missing.
pub fn installed() -> Result<std::path::PathBuf, String> {
    rig::installed().map_err(|e| e.to_string())
}

/// What the connector relays, and where.
pub struct ConnectorSpec<'a> {
    /// The database (on the shared cluster).
    pub db: &'a TestDb,
    /// Its replication slot, which it creates.
    pub slot: &'a str,
    /// Its publication, which it creates for the outbox table only.
    pub publication: &'a str,
    /// The broker's `bootstrap.servers`.
    pub bootstrap: &'a str,
    /// The router's settings (`transforms.outbox.<key>`), after `type`.
    pub router: &'a [(&'a str, String)],
    /// More connector settings (converters, for instance).
    pub extra: &'a [(&'a str, String)],
}

/// A running Kafka Connect standalone worker with one Debezium PostgreSQL connector.
pub struct Connect(rig::Connect);

impl Connect {
    /// Starts Connect with the connector of `spec` (named `dbz_<database>`); returns once its
    /// task runs and its slot streams, or panics with the end of Connect's log.
    pub fn start(spec: &ConnectorSpec<'_>) -> Connect {
        let cluster = super::cluster();
        let name = format!("dbz_{}", spec.db.name);
        let connect = rig::Connect::start(
            &rig::ConnectorSpec {
                name: &name,
                db: rig::Database {
                    host: "127.0.0.1",
                    port: cluster.port(),
                    user: walbox::sandbox::postgres::SUPERUSER,
                    password: cluster.password(),
                    dbname: &spec.db.name,
                },
                slot: spec.slot,
                publication: spec.publication,
                bootstrap: spec.bootstrap,
                router: spec.router,
                extra: spec.extra,
            },
            || spec.db.streaming(spec.slot),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        eprintln!("Kafka Connect log: {}", connect.log_path().display());
        Connect(connect)
    }
}

impl Deref for Connect {
    type Target = rig::Connect;
    fn deref(&self) -> &rig::Connect {
        &self.0
    }
}

impl DerefMut for Connect {
    fn deref_mut(&mut self) -> &mut rig::Connect {
        &mut self.0
    }
}

/// Runs `walbox from-debezium` on `connect`'s connector configuration and writes the
/// walbox.toml it prints, and the database password it leaves to a file, into `dir`. Returns
/// the variables that point walbox at both (`WALBOX_CONFIG`, `WALBOX_POSTGRES_PASSWORD_FILE`).
/// Panics when the command fails (a setting it cannot honour included) or when the password
/// appears in its output.
pub fn walbox_config(connect: &Connect, dir: &std::path::Path) -> Vec<(String, String)> {
    let connector = connect.connector_config();
    let out = super::walbox_output(
        &["from-debezium", connector.to_str().expect("a UTF-8 path")],
        &[],
    );
    let (toml, notes) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "walbox from-debezium: {:?}\n{notes}",
        out.status
    );
    let password = super::cluster().password();
    assert!(
        !toml.contains(password) && !notes.contains(password),
        "walbox from-debezium copied the password:\n{toml}\n{notes}"
    );
    let config = dir.join("walbox.toml");
    let password_file = dir.join("postgres-password");
    fs::write(&config, &toml).expect("write walbox.toml");
    fs::write(&password_file, format!("{password}\n")).expect("write the password file");
    vec![
        ("WALBOX_CONFIG".into(), config.display().to_string()),
        (
            "WALBOX_POSTGRES_PASSWORD_FILE".into(),
            password_file.display().to_string(),
        ),
    ]
}
