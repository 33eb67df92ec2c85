//! What the configuration tests share (compiled for tests only): a configuration file holding
//! some text, and an environment from name/value pairs, the two inputs of `load_from`.

use std::io::Write;

/// An environment of `(name, value)` pairs, as `load_from` takes it.
pub(crate) fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A temporary file holding `text`, removed when dropped.
pub(crate) fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}
