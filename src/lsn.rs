//! Log sequence numbers: [`Lsn`], a byte position in the write-ahead log, printed as PostgreSQL
//! prints it (`0/16B3748`) in logs, headers (`walbox.commit_lsn`) and `walbox status`.
//!
//! The type lives in the `walbox-pgoutput` crate (`crates/pgoutput`), beside the decoder whose
//! messages carry it; this module names it for the rest of walbox.

pub use pgoutput::lsn::{Lsn, ParseLsnError};
