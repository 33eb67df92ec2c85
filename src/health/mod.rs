//! Watching the slot: health readings turned into alert levels ([`alert`]), the monitor that
//! exports them and stops walbox on a lost slot ([`monitor`]), the catch-up estimate it keeps
//! ([`progress`]), alert delivery ([`webhook`]), and the `walbox status` /
//! `walbox recreate-slot` commands ([`status`]).

pub mod alert;
pub mod monitor;
pub mod progress;
pub mod status;
pub mod webhook;
