//! The two forms of the effect every fault test runs with: a statement for each record
//! (`effect.sql`) and one statement for each batch (`effect.batch_sql`, the records in
//! `$records`). Both write the same rows to `effects` and fail the same records (the test
//! database's `checked_payload`), so a test asserts the same outcome of either.

/// How the inbox applies the effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `effect.sql`: `apply_effect(…)` for each new record.
    PerRecord,
    /// `effect.batch_sql`: one `INSERT … SELECT … FROM jsonb_to_recordset($records)` per batch.
    Set,
}

/// The set-based effect: the rows `apply_effect` writes, for all of the batch's new records at
/// once, in offset order; `checked_payload` raises for a poison record (and a flaky one's first
/// attempts), which fails the whole statement.
pub const BATCH_EFFECT: &str = "INSERT INTO effects (message_id, message_key, payload, kafka_partition, kafka_offset) \
     SELECT r.message_id, r.key, checked_payload(r.message_id, r.payload), r.partition, r.\"offset\" \
     FROM jsonb_to_recordset($records) AS r(message_id text, key text, payload jsonb, partition int, \"offset\" bigint) \
     ORDER BY r.\"offset\"";

impl Form {
    /// `env` (an inbox environment with `effect.sql` set) with this form's effect.
    pub fn env(self, env: Vec<(String, String)>) -> Vec<(String, String)> {
        match self {
            Form::PerRecord => env,
            Form::Set => env
                .into_iter()
                .map(|(k, v)| match k.as_str() {
                    "WALBOX_INBOX_EFFECT_SQL" => (
                        "WALBOX_INBOX_EFFECT_BATCH_SQL".to_owned(),
                        BATCH_EFFECT.to_owned(),
                    ),
                    _ => (k, v),
                })
                .collect(),
        }
    }

    /// How often a failing record's effect ran beyond its own attempts: in the set form the
    /// first attempt is the whole batch's statement, which names no record (the records are
    /// then applied one by one), when the batch had `new` records besides it.
    pub fn batch_attempts(self, new: usize) -> i64 {
        match self {
            Form::Set if new > 1 => 1,
            _ => 0,
        }
    }
}

/// `both_forms!(name, …)`: each test function `name(form: Form)` runs as two tests,
/// `name::per_record` and `name::set_based`; attributes before a name go to both.
macro_rules! both_forms {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {$(
        $(#[$attr])*
        mod $name {
            #[test]
            fn per_record() {
                super::$name(super::Form::PerRecord)
            }
            #[test]
            fn set_based() {
                super::$name(super::Form::Set)
            }
        }
    )*};
}
