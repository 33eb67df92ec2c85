//! Log sequence numbers: [`Lsn`], a byte position in the write-ahead log, printed as PostgreSQL
//! prints it (`0/16B3748`) in logs, headers (`walbox.commit_lsn`) and `walbox status`.
//!
//! The type lives in the `walbox-pgoutput` crate (`crates/pgoutput`), beside the decoder whose
//! messages carry it; this module names it for the rest of walbox.

pub use pgoutput::lsn::{Lsn, ParseLsnError};

use crate::failure::{Classify, Failure};

impl Classify for ParseLsnError {
    /// An LSN that is not `X/Y` comes from a person (a flag, a setting): a configuration error
    /// (exit 3). Positions the server sends are parsed where a bad one is a protocol error.
    fn failure(&self) -> Option<Failure> {
        Some(Failure::Config)
    }
}
