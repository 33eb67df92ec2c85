//! PostgreSQL side: WAL → [`pgoutput::LogicalMessage`]. Start-up checks and set-up
//! ([`catalog`]), opening a slot session ([`session`]), the replication connection and its CopyBoth stream ([`replication`]), the
//! pgoutput decoder ([`pgoutput`]), slot health readings ([`slot`]), what the publication
//! covers while walbox streams ([`publication`]), what decoding on a standby changes
//! ([`standby`]) and timeline histories ([`timeline`]).

pub mod catalog;
pub mod column_type;
pub mod pgoutput;
pub mod publication;
pub mod replication;
pub mod session;
pub mod slot;
pub mod standby;
pub mod timeline;
