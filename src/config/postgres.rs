//! `[postgres]`: where the WAL comes from: the connection, the replication slot, the
//! publication, the interval of standby status updates, what a process does when another one
//! relays the slot (`on_slot_busy`), and when a silent replication connection is presumed dead
//! (`receive_timeout`, like PostgreSQL's own `wal_receiver_timeout`).
//!
//! Invariants: the connection strings are never shown: `RawPostgres`'s `Debug` redacts `url` and
//! `primary_url`, and [`PostgresConfig`] holds them parsed as `ConnInfo`s, whose `Debug` redacts
//! the password.
//! Validation ([`RawPostgres::validate`]) guarantees a slot name of lower-case letters, digits
//! and underscores, slot and publication names of 1 to 63 characters (63 with the longest shard
//! suffix), 1 to [`MAX_SHARDS`] shards, and a status interval between 1 ms and 1 s.
//!
//! The connection keys (`url`, `password`) are every `[postgres]` section's, `walbox inbox`'s
//! too: [`RawPgConnection`] validates them and declares their variables for both commands.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::conninfo::ConnInfo;
use super::env::{EnvLayout, Kind, SecretKey, Setting};
use super::error::ConfigError;
use super::target::SessionAttrs;
use super::units::{parse_duration, HumanDuration};

/// The connection keys of a `[postgres]` section, `walbox run`'s and `walbox inbox`'s: each
/// section declares the two fields (so that an unknown key's message lists the section's
/// keys), and hands them here to be checked.
pub(crate) struct RawPgConnection {
    /// `url`: a connection URL or libpq key=value string.
    pub url: Option<String>,
    /// `password`: the password of `url`'s role (overrides one in `url`).
    pub password: Option<String>,
}

/// A validated [`RawPgConnection`].
pub(crate) struct PgConnection {
    /// Parsed connection settings (password redacted in `Debug`).
    pub conn: ConnInfo,
    /// Where `conn`'s password was set, for messages about it.
    pub password_key: &'static str,
}

impl RawPgConnection {
    /// The variables of the connection keys (`<PREFIX>_POSTGRES_URL`, `…_PASSWORD`).
    pub(crate) const SETTINGS: &'static [Setting] = &[
        (&["postgres"], "url", Kind::Str),
        (&["postgres"], "password", Kind::Str),
    ];

    /// Both are secrets: each may also be given as `<key>_file`.
    pub(crate) const SECRETS: &'static [SecretKey] =
        &[(&["postgres"], "url"), (&["postgres"], "password")];

    /// `url` is required (the message names `env`'s variable for it) and must parse; a
    /// `password` replaces the URL's.
    pub(crate) fn validate(self, env: &EnvLayout) -> Result<PgConnection, ConfigError> {
        let url = self.url.ok_or_else(|| {
            ConfigError::Invalid(format!(
                "postgres.url is required (set it in the file or {})",
                env.var(&["postgres"], "url")
            ))
        })?;
        let mut conn: ConnInfo = url
            .parse()
            .map_err(|e| ConfigError::Invalid(format!("postgres.url: {e}")))?;
        let mut password_key = "postgres.url";
        if let Some(password) = self.password {
            conn.password = Some(password);
            password_key = "postgres.password_file (or postgres.password)";
        }
        Ok(PgConnection { conn, password_key })
    }
}

/// `[postgres]` as written.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPostgres {
    /// Connection URL or libpq key=value string.
    pub url: Option<String>,
    /// The password of `url`'s role (overrides one in `url`), e.g. from `password_file`.
    pub password: Option<String>,
    /// The primary's connection, when `url` is a standby.
    pub primary_url: Option<String>,
    /// Replication slot name.
    pub slot: Option<String>,
    /// Publication name.
    pub publication: Option<String>,
    /// Create the slot when it is missing.
    pub create_slot: Option<bool>,
    /// Create the publication when it is missing.
    pub create_publication: Option<bool>,
    /// Interval between standby status updates (at most 1 s).
    pub status_interval: Option<HumanDuration>,
    /// `"wait"` (default): several walbox processes may run for the slot, one streams, the
    /// others wait as standbys; `"fail"`: exit 6 when the slot is in use.
    pub on_slot_busy: Option<String>,
    /// A replication connection silent this long is presumed dead (`"0"`/`"off"` disables).
    pub receive_timeout: Option<String>,
    /// Make the slot a failover slot (PostgreSQL 17+), synchronized to standbys.
    pub failover_slot: Option<bool>,
    /// Relay the outbox through this many slots, each carrying one hash bucket of the
    /// aggregate id (PostgreSQL 15+, publication row filters). Default 1.
    pub shards: Option<u32>,
}

impl fmt::Debug for RawPostgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawPostgres")
            .field("url", &self.url.as_ref().map(|_| "<redacted>"))
            .field(
                "primary_url",
                &self.primary_url.as_ref().map(|_| "<redacted>"),
            )
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .finish_non_exhaustive()
    }
}

impl RawPostgres {
    /// `walbox run`'s settings of `[postgres]` besides the connection's.
    pub(super) const SETTINGS: &'static [Setting] = &[
        (&["postgres"], "primary_url", Kind::Str),
        (&["postgres"], "slot", Kind::Str),
        (&["postgres"], "publication", Kind::Str),
        (&["postgres"], "create_slot", Kind::Bool),
        (&["postgres"], "create_publication", Kind::Bool),
        (&["postgres"], "status_interval", Kind::Str),
        (&["postgres"], "on_slot_busy", Kind::Str),
        (&["postgres"], "receive_timeout", Kind::Str),
        (&["postgres"], "failover_slot", Kind::Bool),
        (&["postgres"], "shards", Kind::Int),
    ];

    /// Its secret besides the connection's.
    pub(super) const SECRETS: &'static [SecretKey] = &[(&["postgres"], "primary_url")];

    /// Checks values and fills in defaults; `env` names the variables in messages.
    pub(super) fn validate(self, env: &EnvLayout) -> Result<PostgresConfig, ConfigError> {
        let PgConnection {
            mut conn,
            password_key,
        } = RawPgConnection {
            url: self.url,
            password: self.password,
        }
        .validate(env)?;
        let failover_slot = self.failover_slot.unwrap_or(false);
        failover_hosts(&mut conn, failover_slot)?;
        let primary: Option<ConnInfo> = self
            .primary_url
            .map(|u| u.parse())
            .transpose()
            .map_err(|e| ConfigError::Invalid(format!("postgres.primary_url: {e}")))?;
        let slot = self.slot.unwrap_or_else(|| "walbox".into());
        if !slot
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(ConfigError::Invalid(format!(
                "postgres.slot {slot:?} may contain only lower-case letters, digits and underscores"
            )));
        }
        valid_identifier("postgres.slot", &slot)?;
        let publication = self.publication.unwrap_or_else(|| "walbox".into());
        valid_identifier("postgres.publication", &publication)?;
        let status_interval = self
            .status_interval
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(1));
        if status_interval.is_zero() || status_interval > Duration::from_secs(1) {
            return Err(ConfigError::Invalid(
                "postgres.status_interval must be between 1ms and 1s".into(),
            ));
        }
        let on_slot_busy = OnSlotBusy::parse(self.on_slot_busy.as_deref())?;
        let receive_timeout = receive_timeout(self.receive_timeout.as_deref())?;
        let shards = self.shards.unwrap_or(1);
        validate_shards(shards, &slot, &publication)?;
        Ok(PostgresConfig {
            conn,
            password_key,
            primary,
            slot,
            publication,
            create_slot: self.create_slot.unwrap_or(false),
            create_publication: self.create_publication.unwrap_or(false),
            status_interval,
            on_slot_busy,
            receive_timeout,
            failover_slot,
            shards,
            shard: None,
            drain_to: None,
        })
    }
}

/// `postgres.receive_timeout`: 60 s unless set, at least 1 s, `"off"` or `"0"` for never.
fn receive_timeout(text: Option<&str>) -> Result<Option<Duration>, ConfigError> {
    match text {
        Some("off") | Some("0") => Ok(None),
        None => Ok(Some(Duration::from_secs(60))),
        Some(t) => {
            let d = parse_duration(t).map_err(|e| {
                ConfigError::Invalid(format!("postgres.receive_timeout: {e} (or \"off\")"))
            })?;
            if d < Duration::from_secs(1) {
                return Err(ConfigError::Invalid(
                    "postgres.receive_timeout must be at least 1s (or \"off\")".into(),
                ));
            }
            Ok(Some(d))
        }
    }
}

/// Validated `[postgres]`.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// Parsed connection settings (password redacted in `Debug`).
    pub conn: ConnInfo,
    /// Where `conn`'s password was set, for messages about it: `postgres.url`, or
    /// `postgres.password_file` / `postgres.password` (which replace the URL's).
    pub password_key: &'static str,
    /// `primary_url`: the primary of the standby `conn` names, for what a standby cannot do
    /// (heartbeats, `pg_log_standby_snapshot()` while a slot is created, the primary's
    /// `wal_level`). Password redacted in `Debug`.
    pub primary: Option<ConnInfo>,
    /// Replication slot.
    pub slot: String,
    /// Publication the slot decodes (`postgres.publication`).
    pub publication: String,
    /// Create the slot when missing.
    pub create_slot: bool,
    /// Create the publication when missing.
    pub create_publication: bool,
    /// Interval between standby status updates.
    pub status_interval: Duration,
    /// What a process does when another one relays the slot.
    pub on_slot_busy: OnSlotBusy,
    /// A replication connection from which nothing arrives for this long is presumed dead and
    /// the session reconnects; halfway, walbox asks the server for a keepalive. `None`: never.
    pub receive_timeout: Option<Duration>,
    /// Create the slot with `FAILOVER`, or turn it on for an existing slot (PostgreSQL 17+), so
    /// that standbys with `sync_replication_slots` keep it through a promotion. With several
    /// hosts in `url`, `conn` then has `target_session_attrs=read-write` ([`failover_hosts`]).
    pub failover_slot: bool,
    /// `postgres.shards`: how many slots the outbox is relayed through (1: `slot` and
    /// `publication` themselves, unfiltered; see [`crate::shard`]).
    pub shards: u32,
    /// The shard this configuration relays, in the per-shard copies [`PostgresConfig::for_shard`]
    /// makes (`slot`/`publication` are then the shard's own); `None` in an unsharded layout.
    pub shard: Option<ShardOf>,
    /// Set only by `walbox reshard` on the sessions that drain the old layout's shards: the
    /// cut position, before which they relay every transaction and at which they stop.
    pub drain_to: Option<crate::lsn::Lsn>,
}

/// The most shards `postgres.shards` may ask for.
pub const MAX_SHARDS: u32 = 64;

/// One shard of a layout of `count` shards: the rows whose aggregate id hashes to bucket
/// `index` (`crate::shard::row_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardOf {
    /// The bucket, `0..count`.
    pub index: u32,
    /// How many shards the layout has (at least 2).
    pub count: u32,
}

impl ShardOf {
    /// What the shard's slot and publication names end with: `_<index>of<count>`. The count
    /// is part of the name so that two layouts can exist side by side while walbox reshards.
    pub fn suffix(&self) -> String {
        format!("_{}of{}", self.index, self.count)
    }
}

impl PostgresConfig {
    /// The shards of `postgres.shards`, each as the configuration of its own session (slot
    /// `<slot>_<k>of<N>`, publication `<publication>_<k>of<N>`); one shard is `self` unchanged.
    pub fn shards(&self) -> Vec<PostgresConfig> {
        self.layout(self.shards)
    }

    /// The shards of a layout of `count` shards (`count` = 1: the unsharded slot and
    /// publication).
    pub fn layout(&self, count: u32) -> Vec<PostgresConfig> {
        if count <= 1 {
            let mut one = self.clone();
            one.shard = None;
            return vec![one];
        }
        (0..count)
            .map(|index| self.for_shard(ShardOf { index, count }))
            .collect()
    }

    /// The configuration of one shard's session.
    pub fn for_shard(&self, shard: ShardOf) -> PostgresConfig {
        let mut c = self.clone();
        c.slot = format!("{}{}", self.slot, shard.suffix());
        c.publication = format!("{}{}", self.publication, shard.suffix());
        c.shard = Some(shard);
        c
    }

    /// The slot of the layout's first shard (the unsharded slot when `count` is 1), and the
    /// base slot name every layout's names start with.
    pub fn base_slot(&self) -> &str {
        match self.shard {
            Some(s) => self
                .slot
                .strip_suffix(&s.suffix())
                .unwrap_or(self.slot.as_str()),
            None => &self.slot,
        }
    }
}

/// Checks `postgres.shards`: 1 to [`MAX_SHARDS`], and names that stay within PostgreSQL's 63
/// characters with the longest suffix. (That logical messages cannot be sharded is a rule
/// across sections, in `document.rs`.)
fn validate_shards(shards: u32, slot: &str, publication: &str) -> Result<(), ConfigError> {
    if !(1..=MAX_SHARDS).contains(&shards) {
        return Err(ConfigError::Invalid(format!(
            "postgres.shards must be between 1 and {MAX_SHARDS}"
        )));
    }
    if shards > 1 {
        let suffix = ShardOf {
            index: shards - 1,
            count: shards,
        }
        .suffix();
        for (what, name) in [
            ("postgres.slot", slot),
            ("postgres.publication", publication),
        ] {
            if name.len() + suffix.len() > 63 {
                return Err(ConfigError::Invalid(format!(
                    "{what} {name:?} is too long for {shards} shards: with the suffix {suffix:?} it must stay within 63 characters"
                )));
            }
        }
    }
    Ok(())
}

/// `postgres.failover_slot` with several hosts in `postgres.url`: a failover slot is used on the
/// primary only, and after a failover the old standby may answer first while still in recovery.
/// So `target_session_attrs` `any` (libpq's default) becomes `read-write`: walbox passes a
/// standby over and waits for the promotion; a value that picks a standby is refused.
fn failover_hosts(conn: &mut ConnInfo, failover_slot: bool) -> Result<(), ConfigError> {
    if !failover_slot || conn.more_hosts.is_empty() {
        return Ok(());
    }
    match conn.target_session_attrs {
        SessionAttrs::Any => conn.target_session_attrs = SessionAttrs::ReadWrite,
        SessionAttrs::ReadWrite | SessionAttrs::Primary => {}
        other => {
            return Err(ConfigError::Invalid(format!(
                "postgres.url: target_session_attrs={other} picks a standby, but postgres.failover_slot = true needs the primary: use target_session_attrs=read-write (the default with failover_slot and several hosts)"
            )))
        }
    }
    Ok(())
}

/// `postgres.on_slot_busy`: what a process does when another one relays the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnSlotBusy {
    /// Wait as a hot standby (the leader lock, `leader.rs`) and take over when the active one
    /// dies or is cut off; retry while the slot is still held by the previous walsender.
    Wait,
    /// Exit 6 (`Failure::SlotInUse`) when the slot is in use; no leader lock.
    Fail,
}

impl OnSlotBusy {
    fn parse(s: Option<&str>) -> Result<Self, ConfigError> {
        match s {
            None | Some("wait") => Ok(OnSlotBusy::Wait),
            Some("fail") => Ok(OnSlotBusy::Fail),
            Some(other) => Err(ConfigError::Invalid(format!(
                "postgres.on_slot_busy {other:?} must be \"wait\" or \"fail\""
            ))),
        }
    }
}

/// A PostgreSQL identifier walbox names: 1 to 63 characters (`NAMEDATALEN - 1`).
pub(crate) fn valid_identifier(what: &str, s: &str) -> Result<(), ConfigError> {
    if s.is_empty() || s.len() > 63 {
        return Err(ConfigError::Invalid(format!(
            "{what} {s:?} must be 1 to 63 characters"
        )));
    }
    Ok(())
}
