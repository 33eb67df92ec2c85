//! `walbox reshard`.
