//! Throwaway local infrastructure for `walbox demo`, the integration tests and
//! the benchmarks: each helper starts a private, disposable server and removes
//! every trace of it when it is dropped.

pub mod broker;
pub mod demo;
pub mod kafka;
pub mod kafka_cluster;
pub mod postgres;
mod programs;
pub mod proxy;
pub mod standby;
pub mod tls;
