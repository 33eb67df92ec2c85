//! The PostgreSQL client shared by the source, the slot monitor, the one-shot commands and the
//! inbox: TLS set-up ([`tls`]) and the ordinary control connection ([`control`]). Connection
//! settings themselves are configuration ([`crate::config::conninfo`]).

pub mod control;
pub mod tls;
