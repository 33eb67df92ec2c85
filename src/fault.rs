//! Fault points: named places on the path WAL → Kafka → confirmed LSN (and Kafka → inbox) where the crash tests
//! stop walbox exactly, instead of at a random moment.
//!
//! With the `failpoints` cargo feature, a point fires when the `FAILPOINTS` environment variable
//! (the [`fail`](https://docs.rs/fail) crate's syntax) gives it the `return` action, e.g.
//! `FAILPOINTS='relay::acked=2*off->return'` crashes at the third time the acks move the
//! frontier. Firing aborts the process: like SIGKILL, nothing is flushed and no destructor
//! runs. Without the feature every point compiles to nothing; production builds never have it.
//!
//! | point                    | where                                                         |
//! |--------------------------|---------------------------------------------------------------|
//! | `relay::session-started` | a session has started streaming, before any event or status   |
//! | `relay::produced`        | an event was handed to the producer (mid-transaction)         |
//! | `relay::acked`           | the broker's acks moved the frontier, before the status update |
//! | `relay::status-sent`     | a status update confirming a new position reached the socket  |
//! | `relay::eos-before-commit` | exactly-once: a transaction's records and progress record were produced (not yet acknowledged), before its commit |
//! | `relay::eos-committing`  | exactly-once: on the commit's own thread, before it waits for the records' acknowledgements and commits |
//! | `relay::eos-flushed`     | exactly-once: on the commit's own thread, every record of the transaction acknowledged, before EndTxn |
//! | `relay::eos-buffered`    | exactly-once: an event was buffered behind the commit in flight |
//! | `relay::eos-committed`   | exactly-once: the Kafka transaction committed, before the frontier moves |
//! | `layout::slots-created` | a shard layout's missing slots were created, before they are moved to one position |
//! | `reshard::drained`       | `walbox reshard` drained the old layout up to the reshard point |
//! | `reshard::old-slot-dropped` | `walbox reshard` dropped one of the old layout's slots       |
//! | `inbox::batch-committed` | an inbox batch committed in PostgreSQL, before its offsets move |

/// Crashes the process at fault point `$name` when it is set to fire; see the module docs.
macro_rules! crash_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        $crate::fault::crash_if_set($name);
    };
}
pub(crate) use crash_point;

/// Starts the fault-point registry from `FAILPOINTS`; keep the guard for the process's life.
#[cfg(feature = "failpoints")]
pub fn setup() -> fail::FailScenario<'static> {
    fail::FailScenario::setup()
}

/// Aborts the process when fault point `name` fires.
#[cfg(feature = "failpoints")]
pub fn crash_if_set(name: &str) {
    if fail::eval(name, |_| ()).is_some() {
        eprintln!("walbox: fault point {name} fired: crashing");
        std::process::abort();
    }
}
