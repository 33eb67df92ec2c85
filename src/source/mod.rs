//! The PostgreSQL side: connection settings and TLS, the replication protocol client, the
//! pgoutput decoder, and the start-up checks on the control connection.
//!
//! Two connections are used: an ordinary one (tokio-postgres) for catalog checks and set-up, and
//! a replication connection (our own client, see [`replication`]) that streams the slot.

pub mod catalog;
pub mod conninfo;
pub mod lsn;
pub mod pgoutput;
pub mod replication;
pub mod slot;
pub mod tls;
