//! What can go wrong in a retention pass.

use crate::failure::{Classify, Failure};
use crate::lsn::Lsn;

/// A retention pass failed (retried at the next interval; never fatal to the relay).
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    /// A statement failed (permissions, a missing column, a lock timeout, …).
    #[error("{}", describe(.0))]
    Query(#[from] tokio_postgres::Error),
    /// The slot has not confirmed the position the deletion needs (the relay is behind).
    #[error("the slot confirmed {confirmed}, the deletion needs {needed}")]
    Behind {
        /// What the deletion needs confirmed.
        needed: Lsn,
        /// What the slot confirmed.
        confirmed: Lsn,
    },
    /// The slot does not exist (any more).
    #[error("replication slot {0:?} does not exist: retention deletes nothing without it")]
    NoSlot(String),
    /// A partition bound walbox cannot read.
    #[error("{0}")]
    Layout(String),
}

impl Classify for RetentionError {
    /// What needs the operator (a privilege, a missing column, a partition bound walbox cannot
    /// read) against what passes by itself (a lock timeout, the relay behind, the slot not
    /// there yet). A retention error never stops the relay: this decides how it is logged.
    fn failure(&self) -> Option<Failure> {
        match self {
            RetentionError::Query(e) => e.failure(),
            RetentionError::Behind { .. } | RetentionError::NoSlot(_) => None,
            RetentionError::Layout(_) => Some(Failure::Schema),
        }
    }
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
        None => e.to_string(),
    }
}
