//! A physical standby of a sandbox cluster, for decoding on a standby (PostgreSQL 16+).
//!
//! [`PgCluster::start_standby`] makes the standby the way an operator without
//! `pg_basebackup` would: a physical slot on the primary, a clean stop of the primary, a file
//! copy of its data directory, the primary started again; then the copy gets
//! `standby.signal`, `primary_conninfo` (the primary's unix socket, trust),
//! `primary_slot_name` and `hot_standby_feedback = on`, and starts on a port of its own.
//!
//! Invariants:
//! - The standby is a [`PgCluster`] like any other (own directory, port, socket; cleaned up
//!   when dropped), with the primary's roles and [`SUPERUSER`] password.
//! - When it is returned, it is in recovery and its WAL receiver streams from the primary.
//! - The primary's slots are not copied: the standby starts without any.

use std::fs;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::postgres::{PgCluster, Result, SandboxError, SUPERUSER};

/// How long [`PgCluster::start_standby`] waits for the WAL receiver to stream.
const STREAMING_TIMEOUT: Duration = Duration::from_secs(60);

/// How to set up a standby; `Default` gives the stock one.
#[derive(Debug, Clone, Default)]
pub struct StandbyOptions {
    /// Extra `postgresql.conf` settings of the standby, applied after (so overriding) the
    /// sandbox's, e.g. `("hot_standby_feedback", "off")`.
    pub settings: Vec<(String, String)>,
    /// Also spawn the watchdog (see `PgClusterOptions::watchdog`).
    pub watchdog: bool,
}

impl PgCluster {
    /// Makes and starts a physical standby of this cluster; see the [module docs](self).
    /// The primary is stopped for the copy (a few seconds) and started again on its port.
    pub fn start_standby(&self, opts: StandbyOptions) -> Result<PgCluster> {
        let mut standby = PgCluster::empty(
            self.bin_dir().to_path_buf(),
            Some(self.password().to_owned()),
            opts.watchdog,
        )?;
        standby.major = self.major();
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let slot = format!("walbox_standby_{}_{n}", std::process::id());
        self.psql(
            "postgres",
            &format!("SELECT pg_create_physical_replication_slot('{slot}', true);"),
        )?;
        self.stop()?;
        let mut cp = self.base_command("cp");
        cp.arg("-a").arg(self.data_dir()).arg(standby.data_dir());
        let copied = super::postgres::run(cp, "cp -a <primary data> <standby data>");
        self.start_again()?;
        copied?;

        let data = standby.data_dir().to_path_buf();
        let replslot = data.join("pg_replslot");
        for entry in fs::read_dir(&replslot)
            .map_err(|e| SandboxError::Io(format!("listing {}", replslot.display()), e))?
            .flatten()
        {
            fs::remove_dir_all(entry.path())
                .map_err(|e| SandboxError::Io(format!("removing {}", entry.path().display()), e))?;
        }
        let quote = |v: &str| format!("'{}'", v.replace('\\', "\\\\").replace('\'', "''"));
        let conninfo = format!(
            "host={} port={} user={SUPERUSER} dbname=postgres application_name=walbox_standby",
            self.socket_dir().display(),
            self.port()
        );
        let mut conf = format!(
            "\n# walbox sandbox standby\nunix_socket_directories = {}\nprimary_conninfo = {}\n\
             primary_slot_name = {}\nhot_standby = on\nhot_standby_feedback = on\n\
             wal_receiver_status_interval = 1s\n",
            quote(&standby.socket_dir().to_string_lossy()),
            quote(&conninfo),
            quote(&slot),
        );
        for (key, value) in &opts.settings {
            conf += &format!("{key} = {}\n", quote(value));
        }
        let conf_path = data.join("postgresql.conf");
        let mut text = fs::read_to_string(&conf_path)
            .map_err(|e| SandboxError::Io(format!("reading {}", conf_path.display()), e))?;
        text += &conf;
        standby.write_owned(&conf_path, text.as_bytes(), 0o600)?;
        standby.write_owned(&data.join("standby.signal"), b"", 0o600)?;
        standby.start_on_free_port()?;
        standby.wait_streaming()?;
        Ok(standby)
    }

    /// Promotes this standby to a primary (`pg_ctl promote -w`): it leaves recovery and accepts
    /// writes; on PostgreSQL 17+ its synchronized slots become usable.
    pub fn promote(&self) -> Result<()> {
        self.pg_ctl("promote -w -t 60").map(drop)
    }

    /// Waits until the server is in recovery and its WAL receiver streams.
    fn wait_streaming(&self) -> Result<()> {
        let deadline = Instant::now() + STREAMING_TIMEOUT;
        let sql = "SELECT pg_is_in_recovery()::text || ' ' || \
                   coalesce((SELECT status FROM pg_stat_wal_receiver), 'none');";
        loop {
            let state = self.psql("postgres", sql)?;
            if state.trim() == "true streaming" {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(SandboxError::Start(
                    format!(
                        "the standby is not streaming from its primary after {STREAMING_TIMEOUT:?} (recovery, WAL receiver: {})",
                        state.trim()
                    ),
                    self.log_file().to_path_buf(),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::postgres::PgClusterOptions;

    #[test]
    fn the_standby_replays_what_the_primary_commits() {
        let primary = PgCluster::start(PgClusterOptions::default()).expect("primary");
        primary
            .psql("postgres", "CREATE TABLE before_copy (v int);")
            .unwrap();
        let standby = primary
            .start_standby(StandbyOptions::default())
            .expect("standby");
        assert_ne!(standby.port(), primary.port());
        let show = "SELECT pg_is_in_recovery(), current_setting('hot_standby_feedback');";
        assert_eq!(standby.psql("postgres", show).unwrap(), "t|on\n");
        assert_eq!(primary.psql("postgres", show).unwrap(), "f|off\n");
        let err = standby
            .psql("postgres", "CREATE TABLE nope (v int);")
            .unwrap_err();
        assert!(err.to_string().contains("read-only"), "{err}");

        primary
            .psql("postgres", "INSERT INTO before_copy VALUES (42);")
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let seen = standby.psql("postgres", "SELECT count(*) FROM before_copy;");
            if seen.unwrap() == "1\n" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the row never reached the standby"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The physical slot holds WAL for the standby, which reports feedback through it.
        let slot = "SELECT active, xmin IS NOT NULL FROM pg_replication_slots WHERE slot_type = 'physical';";
        assert_eq!(primary.psql("postgres", slot).unwrap(), "t|t\n");
        assert_eq!(
            standby
                .psql("postgres", "SELECT count(*) FROM pg_replication_slots;")
                .unwrap(),
            "0\n"
        );
        let dir = standby.data_dir().to_path_buf();
        drop(standby);
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
