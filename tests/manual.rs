//! The manual against the code: every configuration key the code accepts is documented (in
//! `docs/configuration.md` for `walbox run`, in `docs/inbox.md` for `walbox inbox`), every link
//! between the manual's pages points at a page and a heading that exist, and the README stays
//! a short entry page that links every page of `docs/`.
//!
//! The keys are not listed by hand: they are asked of the configuration loaders themselves.
//! Every section is deserialized with unknown keys refused, and the refusal names the keys the
//! section has ("unknown field `…`, expected one of …"); a key that is itself a table answers a
//! probe inside it the same way, so the whole tree of keys is walked.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const PROBE: &str = "zz_probe";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A loader: the error message for a file's contents, if it is refused.
type Loader = fn(&Path) -> Option<String>;

fn relay_loader(path: &Path) -> Option<String> {
    walbox::config::load_from(Some(path), &mut std::iter::empty())
        .err()
        .map(|e| e.to_string())
}

fn inbox_loader(path: &Path) -> Option<String> {
    walbox::inbox::config::load_from(Some(path), &mut std::iter::empty())
        .err()
        .map(|e| e.to_string())
}

/// The TOML that puts `key = 1` inside the table at `path`; a part ending in `[]` is an array
/// of tables, of which the probe fills the first entry.
fn probe_document(path: &[String]) -> String {
    let Some(last) = path.len().checked_sub(1) else {
        return format!("{PROBE} = 1\n");
    };
    let mut doc = String::new();
    let mut name = Vec::new();
    for (i, part) in path.iter().enumerate() {
        match part.strip_suffix("[]") {
            Some(array) => {
                name.push(array);
                doc.push_str(&format!("[[{}]]\n", name.join(".")));
            }
            None => {
                name.push(part);
                if i == last {
                    doc.push_str(&format!("[{}]\n", name.join(".")));
                }
            }
        }
    }
    doc + &format!("{PROBE} = 1\n")
}

/// The keys serde names in an unknown-field refusal of the probe, or `None` when the probe
/// was refused for another reason (the path is not a table of named keys).
fn named_keys(message: &str) -> Option<Vec<String>> {
    let at = message.find(&format!("unknown field `{PROBE}`"))?;
    let rest = &message[at..];
    if rest.contains("there are no fields") {
        return Some(Vec::new());
    }
    let list = rest.split_once("expected ")?.1;
    let list = list.split(" in `").next().unwrap_or(list);
    Some(
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

/// Every key the loader accepts, as dotted paths; an array of tables as `a.b[]`.
fn accepted_keys(loader: Loader) -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("probe.toml");
    let ask = |path: &[String]| -> Option<Vec<String>> {
        std::fs::write(&file, probe_document(path)).unwrap();
        named_keys(&loader(&file)?)
    };
    let mut keys = BTreeSet::new();
    let top = ask(&[]).expect("the loader refuses an unknown top-level key by name");
    let mut todo: Vec<Vec<String>> = top.into_iter().map(|k| vec![k]).collect();
    while let Some(mut path) = todo.pop() {
        let mut children = ask(&path);
        if children.is_none() {
            // An array of tables answers only a probe inside one of its entries.
            let last = path.pop().unwrap();
            path.push(format!("{last}[]"));
            children = ask(&path);
            if children.is_none() {
                path.pop();
                path.push(last);
            }
        }
        match children {
            Some(children) if !children.is_empty() => {
                for c in children {
                    let mut p = path.clone();
                    p.push(c);
                    todo.push(p);
                }
            }
            _ => {
                keys.insert(path.join("."));
            }
        }
    }
    keys
}

/// The doc's text with brace lists expanded: `a.{b, c}` → `a.b` `a.c`.
fn expanded(doc: &str) -> String {
    let mut out = String::new();
    for part in doc.split('`') {
        if let (Some(open), Some(close)) = (part.find(".{"), part.find('}')) {
            let head = &part[..open];
            for item in part[open + 2..close].split(',') {
                out.push_str(&format!(" `{head}.{}` ", item.trim()));
            }
        }
        out.push('`');
        out.push_str(part);
    }
    out
}

/// Whether `key` is named in `doc`: as itself in backticks, or with a `prefix` the doc uses for
/// it (an array of tables' keys are also written under the table's own name).
fn documented(doc: &str, key: &str, aliases: &[(&str, &str)]) -> bool {
    let mut names = vec![key.to_owned()];
    for (from, to) in aliases {
        if let Some(rest) = key.strip_prefix(from) {
            names.push(format!("{to}{rest}"));
        }
    }
    names.iter().any(|n| {
        doc.contains(&format!("`{n}`"))
            || doc.contains(&format!("`{n}.*`"))
            || doc.contains(&format!("`{n}.<"))
            || doc.contains(&format!("`{n} = "))
    })
}

fn missing(doc: &str, keys: &BTreeSet<String>, aliases: &[(&str, &str)]) -> Vec<String> {
    let doc = expanded(doc);
    keys.iter()
        .filter(|k| !documented(&doc, k, aliases))
        .cloned()
        .collect()
}

#[test]
fn every_key_walbox_run_accepts_is_in_docs_configuration_md() {
    let keys = accepted_keys(relay_loader);
    assert!(
        keys.contains("postgres.url") && keys.contains("kafka.brokers") && keys.len() > 40,
        "the probe does not see the configuration's keys: {keys:?}"
    );
    let doc = read("docs/configuration.md");
    // `[[outbox.tables]]` entries and `[outbox.messages]` take the keys `[outbox]` takes for one
    // table, which the doc's per-table table lists by their short names.
    let gone = missing(
        &doc,
        &keys,
        &[
            ("outbox.tables[].", "outbox."),
            ("outbox.tables[].", ""),
            ("outbox.messages.", ""),
        ],
    );
    assert!(
        gone.is_empty(),
        "keys walbox accepts that docs/configuration.md does not document: {gone:?}"
    );
}

#[test]
fn every_key_walbox_inbox_accepts_is_in_docs_inbox_md() {
    let keys = accepted_keys(inbox_loader);
    assert!(
        keys.iter().any(|k| k.starts_with("kafka.")) && keys.len() > 10,
        "the probe does not see the inbox configuration's keys: {keys:?}"
    );
    let doc = read("docs/inbox.md");
    let gone = missing(&doc, &keys, &[]);
    assert!(
        gone.is_empty(),
        "keys walbox inbox accepts that docs/inbox.md does not document: {gone:?}"
    );
}

/// The lines of a Markdown text outside its fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut in_code = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            return false;
        }
        !in_code
    })
}

/// Markdown links `[text](target)` outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchor of a heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .filter(|line| line.starts_with('#'))
        .map(|line| anchor(line.trim_start_matches('#')))
        .collect()
}

fn pages() -> Vec<String> {
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.ends_with(".md").then(|| format!("docs/{name}"))
        })
        .collect();
    pages.push("README.md".to_owned());
    pages.sort();
    pages
}

#[test]
fn every_link_of_the_manual_points_at_a_file_and_a_heading_that_exist() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = read(&page);
        let dir = Path::new(&page).parent().unwrap().to_path_buf();
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (file, frag) = link.split_once('#').unwrap_or((link.as_str(), ""));
            let target = if file.is_empty() {
                PathBuf::from(&page)
            } else {
                dir.join(file)
            };
            let path = root().join(&target);
            if !path.exists() {
                broken.push(format!("{page}: {link} (no such file)"));
                continue;
            }
            if !frag.is_empty() {
                let there = std::fs::read_to_string(&path).unwrap_or_default();
                if !anchors(&there).contains(frag) {
                    broken.push(format!("{page}: {link} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_short_and_links_every_page_of_the_manual() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; the details belong in docs/"
    );
    let linked: BTreeSet<String> = links(&readme)
        .into_iter()
        .map(|l| l.split('#').next().unwrap().to_owned())
        .collect();
    let unlinked: Vec<String> = pages()
        .into_iter()
        .filter(|p| p.starts_with("docs/") && !linked.contains(p))
        .collect();
    assert!(
        unlinked.is_empty(),
        "pages the README does not link: {unlinked:?}"
    );
}

#[test]
fn the_probe_sees_keys_and_the_doc_check_sees_a_missing_one() {
    // The checks above pass vacuously if the probe finds nothing or the matcher matches
    // anything: a key the doc does not name must be reported.
    let keys = BTreeSet::from(["postgres.url".to_owned(), "postgres.no_such_key".to_owned()]);
    let doc = read("docs/configuration.md");
    assert_eq!(
        missing(&doc, &keys, &[]),
        vec!["postgres.no_such_key".to_owned()]
    );
    assert_eq!(
        named_keys("unknown field `zz_probe`, expected one of `a`, `b` in `kafka`"),
        Some(vec!["a".to_owned(), "b".to_owned()])
    );
    assert_eq!(
        named_keys("unknown field `zz_probe`, expected `a` or `b`"),
        Some(vec!["a".to_owned(), "b".to_owned()])
    );
}

#[test]
fn every_long_page_starts_with_contents_naming_each_of_its_sections() {
    let mut wrong = Vec::new();
    for page in pages().into_iter().filter(|p| p.starts_with("docs/")) {
        let text = read(&page);
        let sections: Vec<String> = prose(&text)
            .filter_map(|l| l.strip_prefix("## "))
            .map(anchor)
            .collect();
        if text.lines().count() < 150 || sections.len() < 3 {
            continue;
        }
        let Some((_, contents)) = text.split_once("**Contents**") else {
            wrong.push(format!("{page}: no **Contents**"));
            continue;
        };
        let listed: BTreeSet<String> = contents
            .split("\n\n")
            .nth(1)
            .map(links)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|l| l.strip_prefix('#').map(str::to_owned))
            .collect();
        for s in sections.iter().filter(|s| !listed.contains(*s)) {
            wrong.push(format!("{page}: #{s} is not in its contents"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
