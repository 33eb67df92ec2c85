//! Watching the slot: health readings turned into alert levels ([`alert`]), the monitor that
//! exports them and stops walbox on a lost slot ([`monitor`]), the catch-up estimate it keeps
//! ([`progress`]), what the progress topic says about a lost slot ([`evidence`]), and alert
//! delivery ([`webhook`]). The `walbox status` and `walbox recreate-slot` commands read these
//! from `cmd/`.

pub mod alert;
pub mod evidence;
pub mod monitor;
pub mod progress;
pub mod webhook;
