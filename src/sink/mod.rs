//! Where events go. Today one sink: Kafka ([`kafka`]).

pub mod kafka;
pub mod topics;
