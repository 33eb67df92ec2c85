//! The PostgreSQL client shared by the source, the slot monitor, the one-shot commands and the
//! inbox: TLS set-up ([`tls`]), the ordinary control connection through tokio-postgres
//! ([`control`]), and the plumbing of walbox's own protocol clients (the replication connection):
//! the framed socket with postgres-protocol's message parsing ([`wire`]) and opening an
//! authenticated session on it ([`auth`]); choosing among several hosts ([`hosts`]). Connection settings themselves are configuration
//! ([`crate::config::conninfo`]).

pub mod auth;
pub mod control;
pub mod hosts;
pub mod tls;
pub mod wire;
