//! Clusters for decoding on a standby: one primary of PostgreSQL 16+ (`WALBOX_TEST_PG` when it
//! is 16 or newer, else 16) with two physical standbys made by the sandbox (a copy of the
//! primary's data directory), shared by the tests of this binary; and, per test, an old pair
//! (PostgreSQL 15, whose standby cannot decode).

use std::sync::{Mutex, MutexGuard, OnceLock};

use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};
use walbox::sandbox::standby::StandbyOptions;

/// The shared primary and its standbys.
pub struct StandbyClusters {
    /// The primary (writes go here).
    pub primary: PgCluster,
    /// A standby set up for decoding (`hot_standby_feedback = on`, a physical slot).
    pub standby: PgCluster,
    /// A standby with `hot_standby_feedback = off`.
    pub no_feedback: PgCluster,
}

/// The major version the standby tests run on: `WALBOX_TEST_PG` if it is 16 or newer (logical
/// decoding on a standby needs 16), else 16.
pub fn standby_major() -> u32 {
    std::env::var("WALBOX_TEST_PG")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|m| *m >= 16)
        .unwrap_or(16)
}

/// The shared clusters, started on first use (both standbys before any test writes), and a
/// guard that keeps the other standby tests out until dropped: one restarts the standby,
/// another holds a transaction open on the primary.
pub fn clusters() -> (&'static StandbyClusters, MutexGuard<'static, ()>) {
    static EXCLUSIVE: Mutex<()> = Mutex::new(());
    let guard = EXCLUSIVE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    (shared(), guard)
}

fn shared() -> &'static StandbyClusters {
    static CLUSTERS: OnceLock<StandbyClusters> = OnceLock::new();
    CLUSTERS.get_or_init(|| {
        let major = standby_major();
        let primary = PgCluster::start(PgClusterOptions {
            watchdog: true,
            major: Some(major),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("start the PostgreSQL {major} primary: {e}"));
        let standby = primary
            .start_standby(StandbyOptions {
                watchdog: true,
                ..Default::default()
            })
            .expect("start the standby");
        let no_feedback = primary
            .start_standby(StandbyOptions {
                watchdog: true,
                settings: vec![("hot_standby_feedback".into(), "off".into())],
            })
            .expect("start the standby without hot_standby_feedback");
        StandbyClusters {
            primary,
            standby,
            no_feedback,
        }
    })
}

/// A PostgreSQL 15 primary with `wal_level = replica` and its standby.
pub fn old_pair() -> (PgCluster, PgCluster) {
    let primary = PgCluster::start(PgClusterOptions {
        major: Some(15),
        settings: vec![("wal_level".into(), "replica".into())],
        ..Default::default()
    })
    .expect("start a PostgreSQL 15 primary");
    let standby = primary
        .start_standby(StandbyOptions::default())
        .expect("start its standby");
    (primary, standby)
}
