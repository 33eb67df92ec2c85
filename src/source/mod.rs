//! PostgreSQL side: WAL → [`pgoutput::LogicalMessage`]. Start-up checks and set-up
//! ([`catalog`]), opening a slot session ([`session`]), the replication connection and its CopyBoth stream ([`replication`]), the
//! pgoutput decoder ([`pgoutput`]) and slot health readings ([`slot`]).

pub mod catalog;
pub mod pgoutput;
pub mod replication;
pub mod session;
pub mod slot;
