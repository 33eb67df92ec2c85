//! PostgreSQL errors, classified once by SQLSTATE: the relay's connections, the one-shot
//! commands, the leader lock, retention and `walbox inbox` ask [`sqlstate`] (or
//! [`postgres_error`]); elsewhere a SQLSTATE only picks the words of a message or a fix (see
//! `failure`'s module docs for the three rules on top of this table).
//!
//! | SQLSTATE | class | exit |
//! |---|---|---|
//! | `55006` object in use (the slot is active elsewhere) | fatal | 6 |
//! | `58P01` (the slot's file is gone), `55000` "can no longer get changes" (an invalidated slot) | fatal | 7 |
//! | `55000` other, `3D000`, `3F000`, `0A000`, `42…` (missing object, syntax) | fatal | 5 |
//! | `28…`, `42501` (authentication, privilege) | fatal | 4 |
//! | `08…` connection, `53…` resources, `57P…` shutdown/restart, `58…` system, `XX…` internal, `40001` serialization, `40P01` deadlock, `55P03` lock not available | [`Class::Transient`] | — |
//! | every other: `22…` data, `23…` constraint, `P0001` raised exception, user-defined codes | [`Class::Effect`] | — |
//!
//! The two slot failures (6, 7) mean something only on a replication connection; a path
//! without a slot (the inbox) retries them as the database's trouble. Where no record's
//! statement ran, [`Class::Effect`] is retried like a transient error (the relay: a value the
//! walsender cannot decode ends the session, and only the same error at the same transaction,
//! session after session, is taken as permanent: `relay/error.rs`).

use super::class::{Class, Classify, Failure};

/// The class of a SQLSTATE; `message` (the server's) tells an invalidated slot from another
/// `55000` (see the table above).
pub fn sqlstate(code: &str, message: &str) -> Class {
    match code {
        "55006" => Class::Fatal(Failure::SlotInUse),
        "58P01" => Class::Fatal(Failure::SlotLost),
        "55000" if message.contains("can no longer get changes") => Class::Fatal(Failure::SlotLost),
        "55000" | "3D000" | "3F000" | "0A000" => Class::Fatal(Failure::Schema),
        "42501" => Class::Fatal(Failure::Auth),
        c if c.starts_with("28") => Class::Fatal(Failure::Auth),
        c if c.starts_with("42") => Class::Fatal(Failure::Schema),
        "40001" | "40P01" | "55P03" => Class::Transient,
        c if ["08", "53", "57P", "58", "XX"]
            .iter()
            .any(|class| c.starts_with(class)) =>
        {
            Class::Transient
        }
        _ => Class::Effect,
    }
}

/// The class of a tokio-postgres error: its SQLSTATE's, or transient without one (the
/// connection failed).
pub fn postgres_error(e: &tokio_postgres::Error) -> Class {
    match e.as_db_error() {
        Some(db) => sqlstate(db.code().code(), db.message()),
        None => Class::Transient,
    }
}

impl Classify for tokio_postgres::Error {
    fn failure(&self) -> Option<Failure> {
        postgres_error(self).fatal()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every SQLSTATE some path of walbox meets (or a representative of its class), with its
    /// class: the one table, read back.
    #[test]
    fn each_sqlstate_has_one_class() {
        let fatal = Class::Fatal;
        let table = [
            ("55006", "", fatal(Failure::SlotInUse)),
            ("58P01", "", fatal(Failure::SlotLost)),
            (
                "55000",
                "can no longer get changes from replication slot \"s\"",
                fatal(Failure::SlotLost),
            ),
            (
                "55000",
                "logical decoding requires wal_level >= logical",
                fatal(Failure::Schema),
            ),
            ("3D000", "", fatal(Failure::Schema)),
            ("3F000", "", fatal(Failure::Schema)),
            ("0A000", "", fatal(Failure::Schema)),
            ("42P01", "", fatal(Failure::Schema)),
            ("42703", "", fatal(Failure::Schema)),
            ("42704", "", fatal(Failure::Schema)),
            ("42883", "", fatal(Failure::Schema)),
            ("42601", "", fatal(Failure::Schema)),
            ("42501", "", fatal(Failure::Auth)),
            ("28P01", "", fatal(Failure::Auth)),
            ("28000", "", fatal(Failure::Auth)),
            ("08006", "", Class::Transient),
            ("08P01", "", Class::Transient),
            ("53300", "", Class::Transient),
            ("53400", "", Class::Transient),
            ("53100", "", Class::Transient),
            ("57P01", "terminating connection", Class::Transient),
            ("57P03", "", Class::Transient),
            ("58030", "", Class::Transient),
            ("XX000", "", Class::Transient),
            ("40001", "", Class::Transient),
            ("40P01", "", Class::Transient),
            ("55P03", "", Class::Transient),
            ("22021", "", Class::Effect),
            ("22P02", "", Class::Effect),
            ("22003", "", Class::Effect),
            ("23505", "", Class::Effect),
            ("23503", "", Class::Effect),
            ("P0001", "", Class::Effect),
            ("P0004", "", Class::Effect),
            ("U0001", "", Class::Effect),
            ("54000", "", Class::Effect),
        ];
        for (code, message, class) in table {
            assert_eq!(sqlstate(code, message), class, "{code} {message:?}");
        }
    }
}
