//! The connector's settings while they are translated ([`Settings`]): each one is taken once by
//! the code that maps it, and what it says about a setting walbox cannot honour, or that needs
//! the operator, is recorded as a [`Finding`]. What is left at the end was taken by nobody.
//!
//! Invariants: a finding names the setting and gives a reason; it never carries the setting's
//! value unless the code that made it knows the value is no secret (a class name, a mode).

use std::collections::BTreeMap;

/// A setting walbox cannot honour, or one the operator must act on, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The connector setting (or `a, b` for several).
    pub key: String,
    /// Why, and what to do.
    pub reason: String,
}

/// The settings not yet taken, and the findings so far.
#[derive(Debug, Default)]
pub struct Settings {
    left: BTreeMap<String, String>,
    /// Settings walbox cannot honour.
    pub unhonoured: Vec<Finding>,
    /// Settings honoured, but needing the operator (a secret to put in a file, a broker list).
    pub notes: Vec<Finding>,
}

impl Settings {
    /// All of `settings`, none taken.
    pub fn new(settings: BTreeMap<String, String>) -> Settings {
        Settings {
            left: settings,
            ..Settings::default()
        }
    }

    /// Takes `key`'s value.
    pub fn take(&mut self, key: &str) -> Option<String> {
        self.left.remove(key)
    }

    /// Takes every setting whose key starts with `prefix`, as (the rest of the key, value).
    pub fn take_prefixed(&mut self, prefix: &str) -> Vec<(String, String)> {
        let keys: Vec<String> = self
            .left
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter()
            .filter_map(|k| {
                let v = self.left.remove(&k)?;
                Some((k[prefix.len()..].to_owned(), v))
            })
            .collect()
    }

    /// The keys not taken yet, in order.
    pub fn left(&self) -> Vec<String> {
        self.left.keys().cloned().collect()
    }

    /// Records a setting walbox cannot honour.
    pub fn refuse(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.unhonoured.push(Finding {
            key: key.into(),
            reason: reason.into(),
        });
    }

    /// Records what the operator must do for an honoured setting.
    pub fn note(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.notes.push(Finding {
            key: key.into(),
            reason: reason.into(),
        });
    }
}
