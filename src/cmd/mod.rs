//! The one-shot commands: each file is one command of the command line, run to completion and
//! mapped to an exit status by `main.rs`.
//!
//! ```text
//! check.rs       walbox check: the preflight's report (the checks live in preflight/)
//! republish.rs   walbox republish: rows still in the outbox → Kafka, with the relay's mapping
//! audit.rs       walbox audit: outbox rows against what Kafka holds
//! reshard.rs     walbox reshard: a new shard layout without reordering an aggregate
//! status.rs      walbox status: the slot's health, alert level and catch-up estimate
//! recreate_slot.rs  walbox recreate-slot: a lost slot replaced, with the window to republish
//! demo.rs        walbox demo (sandbox feature)
//! ```
//!
//! # Invariants
//! - The commands sit above the stages and `app`: they may use any of them, and nothing but
//!   `main.rs` uses a command (docs/architecture.md).
//! - A command that relays (`reshard`'s drain) does it through [`crate::app::run_slots`], the
//!   code `walbox run` uses, never a copy of it.

pub mod audit;
pub mod check;
#[cfg(feature = "sandbox")]
pub mod demo;
pub mod recreate_slot;
pub mod republish;
pub mod reshard;
pub mod status;
