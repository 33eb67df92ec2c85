//! The layout rules of docs/architecture.md, checked on the source tree: no file over 800
//! lines, no import cycle between files, the dependency directions (`config` and `pg`
//! depend on no stage, `inbox` on no part of the relay), and every error type classified.
//!
//! An import is any path through `crate::`, `super::` or `self::`, or a `use` of a child
//! module, in code (comments are skipped); it points at the file of the longest module prefix
//! it names. A `mod x;` declaration is not an import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 800;

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The code of a file without its comments (line comments, doc comments, block comments) and
/// without the contents of string and char literals.
fn code_of(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'r' if (i == 0 || !is_ident(b[i - 1]))
                && matches!(b.get(i + 1), Some(b'"') | Some(b'#')) =>
            {
                // A raw string r"…" or r#"…"#, else an identifier starting with r.
                let mut j = i + 1;
                while b.get(j) == Some(&b'#') {
                    j += 1;
                }
                let hashes = j - i - 1;
                if b.get(j) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let mut end = j + 1;
                while end < b.len()
                    && !(b[end] == b'"' && (0..hashes).all(|k| b.get(end + 1 + k) == Some(&b'#')))
                {
                    end += 1;
                }
                out.push_str("\"\"");
                i = end + 1 + hashes;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                out.push_str("\"\"");
                i += 1;
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') || b.get(i + 1) == Some(&b'\\') => {
                // A char literal ('x', '\n', '\u{…}'); a lifetime has no closing quote.
                i += 1;
                while i < b.len() && b[i] != b'\'' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                out.push_str("' '");
                i += 1;
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Tokens: identifiers, `::`, and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if is_ident(b[i]) {
            let start = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            out.push(code[start..i].to_owned());
        } else if b[i] == b':' && b.get(i + 1) == Some(&b':') {
            out.push("::".into());
            i += 2;
        } else if b[i].is_ascii_whitespace() {
            i += 1;
        } else {
            out.push((b[i] as char).to_string());
            i += 1;
        }
    }
    out
}

/// The paths of a `use` tree starting at `toks[*i]`, each with `prefix` prepended.
fn use_tree(toks: &[String], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    while *i < toks.len() {
        let t = &toks[*i];
        if t == "{" {
            *i += 1;
            while *i < toks.len() && toks[*i] != "}" {
                use_tree(toks, i, path.clone(), out);
                if *i < toks.len() && toks[*i] == "," {
                    *i += 1;
                }
            }
            *i += 1;
            return;
        } else if t == "::" {
            *i += 1;
        } else if t.as_bytes().first().is_some_and(|c| is_ident(*c)) && t != "as" {
            path.push(t.clone());
            *i += 1;
        } else if t == "as" {
            *i += 2;
        } else {
            break;
        }
    }
    out.push(path);
}

/// The module tree: module path → file, and file → module path.
struct Modules {
    by_path: BTreeMap<Vec<String>, PathBuf>,
    of_file: BTreeMap<PathBuf, Vec<String>>,
}

fn modules(src: &Path, files: &[PathBuf]) -> Modules {
    let mut of_file = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let mut parts: Vec<String> = rel
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        of_file.insert(f.clone(), parts);
    }
    // `#[path = "x.rs"] mod name;` puts x.rs at `<this module>::name`.
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let Some(rest) = line.trim().strip_prefix("#[path = \"") else {
                continue;
            };
            let target = f.parent().unwrap().join(rest.trim_end_matches("\"]"));
            // The item the attribute belongs to: `[pub[(…)]] mod name`, after other attributes.
            let item = tokens(&code_of(&lines[n + 1..].join("\n")));
            let name = item
                .iter()
                .position(|t| t == "mod")
                .and_then(|i| item.get(i + 1))
                .unwrap_or_else(|| panic!("{}: no `mod` after #[path]", f.display()))
                .clone();
            let mut path = of_file[f].clone();
            path.push(name);
            of_file.insert(target, path);
        }
    }
    let by_path = of_file
        .iter()
        .map(|(f, p)| (p.clone(), f.clone()))
        .collect();
    Modules { by_path, of_file }
}

impl Modules {
    /// The file of the longest module prefix of `path`.
    fn file_of(&self, path: &[String]) -> Option<&PathBuf> {
        (0..=path.len())
            .rev()
            .find_map(|n| self.by_path.get(&path[..n]))
    }

    /// `path` as seen from module `me`, made absolute (`crate`, `super`, `self` resolved);
    /// `None` when it does not start in this crate.
    fn absolute(&self, me: &[String], path: &[String]) -> Option<Vec<String>> {
        let (base, rest): (Vec<String>, &[String]) = match path.first()?.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (me.to_vec(), &path[1..]),
            "super" => {
                let mut base = me.to_vec();
                let mut rest = path;
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
                (base, rest)
            }
            _ => return None,
        };
        Some(base.into_iter().chain(rest.iter().cloned()).collect())
    }
}

/// File → the files it imports.
fn imports(src: &Path) -> (Modules, BTreeMap<PathBuf, BTreeSet<PathBuf>>) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mods = modules(src, &files);
    let mut graph = BTreeMap::new();
    for f in &files {
        let file_module = mods.of_file[f].clone();
        let toks = tokens(&code_of(&std::fs::read_to_string(f).unwrap()));
        let mut paths = Vec::new();
        // Inline modules (`mod tests { … }`) open inside the file: (name, brace depth).
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0;
        let mut me = file_module.clone();
        let mut i = 0;
        while i < toks.len() {
            match toks[i].as_str() {
                "{" => depth += 1,
                "}" => {
                    depth -= 1;
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                        me = file_module.clone();
                        me.extend(inline.iter().map(|(n, _)| n.clone()));
                    }
                }
                "mod" if toks.get(i + 2).map(String::as_str) == Some("{") => {
                    inline.push((toks[i + 1].clone(), depth));
                    me.push(toks[i + 1].clone());
                    depth += 1;
                    i += 3;
                    continue;
                }
                _ => {}
            }
            if toks[i] == "use" {
                i += 1;
                let mut tree = Vec::new();
                use_tree(&toks, &mut i, Vec::new(), &mut tree);
                for p in tree {
                    // `use child::…` is relative to this module.
                    let child = p.first().is_some_and(|first| {
                        let mut c = me.clone();
                        c.push(first.clone());
                        mods.by_path.contains_key(&c)
                    });
                    if child {
                        paths.push(me.iter().chain(&p).cloned().collect());
                    } else if let Some(a) = mods.absolute(&me, &p) {
                        paths.push(a);
                    }
                }
                continue;
            }
            if matches!(toks[i].as_str(), "crate" | "super" | "self")
                && toks.get(i + 1).map(String::as_str) == Some("::")
                && (i == 0 || toks[i - 1] != "::")
            {
                let mut p = vec![toks[i].clone()];
                let mut j = i + 1;
                while toks.get(j).map(String::as_str) == Some("::")
                    && toks
                        .get(j + 1)
                        .is_some_and(|t| t.as_bytes().first().is_some_and(|c| is_ident(*c)))
                {
                    p.push(toks[j + 1].clone());
                    j += 2;
                }
                if let Some(a) = mods.absolute(&me, &p) {
                    paths.push(a);
                }
                i = j;
                continue;
            }
            i += 1;
        }
        let deps: BTreeSet<PathBuf> = paths
            .iter()
            .filter_map(|p| mods.file_of(p).cloned())
            .filter(|t| t != f)
            .collect();
        graph.insert(f.clone(), deps);
    }
    (mods, graph)
}

/// Strongly connected components with more than one file (Tarjan).
fn cycles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        graph: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        next: usize,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a PathBuf) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.stack.contains(&w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn no_source_test_or_bench_file_is_over_800_lines() {
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches", "crates"] {
        rust_files(&root().join(dir), &mut files);
    }
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:?}");
}

#[test]
fn no_import_cycle_between_files() {
    let src = root().join("src");
    let (_, graph) = imports(&src);
    let rel = |f: &PathBuf| f.strip_prefix(&src).unwrap().display().to_string();
    let found: Vec<String> = cycles(&graph)
        .into_iter()
        .map(|c| {
            c.iter()
                .map(|f| {
                    let inside: Vec<String> =
                        graph[f].iter().filter(|d| c.contains(d)).map(rel).collect();
                    format!("{} → {}", rel(f), inside.join(", "))
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .collect();
    assert!(
        found.is_empty(),
        "files that import each other:\n{}",
        found.join("\n")
    );
}

/// What a top-level module may import, read from docs/architecture.md's folder table ("The
/// folders"): its `may import` cell, a list of backticked modules and the words `foundation`
/// (the modules of the row whose stage is "foundation") and `anything`; a clause
/// "`file.rs`: also …" after a `;` allows more to that file of the folder only. Parenthesised
/// remarks are prose. A module may always import itself.
#[derive(Debug, Default)]
struct Allowed {
    folder: BTreeSet<String>,
    per_file: BTreeMap<String, BTreeSet<String>>,
}

/// The backticked words of `text` outside parentheses.
fn backticked(text: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            c if depth == 0 => prose.push(c),
            _ => {}
        }
    }
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The rows of the folder table: (modules of the row, stage, may-import cell).
fn table_rows(doc: &str) -> Vec<(BTreeSet<String>, String, String)> {
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("The folders"))
        .expect("docs/architecture.md has a section \"The folders\"");
    section
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(2) // the header and its separator
        .map(|l| {
            let cells: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            assert_eq!(
                cells.len(),
                3,
                "docs/architecture.md: a folder row of 3 cells: {l}"
            );
            let modules = backticked(cells[0])
                .iter()
                .map(|m| m.trim_end_matches('/').trim_end_matches(".rs").to_owned())
                .collect();
            (modules, cells[1].to_owned(), cells[2].to_owned())
        })
        .collect()
}

/// Top-level module → what it may import, from the folder table.
fn architecture_table(doc: &str) -> BTreeMap<String, Allowed> {
    let rows = table_rows(doc);
    let all: BTreeSet<String> = rows.iter().flat_map(|(m, _, _)| m.clone()).collect();
    let foundation: BTreeSet<String> = rows
        .iter()
        .filter(|(_, stage, _)| stage == "foundation")
        .flat_map(|(m, _, _)| m.clone())
        .collect();
    assert!(
        !foundation.is_empty(),
        "no foundation row in the folder table"
    );
    let words = |text: &str| -> BTreeSet<String> {
        let mut out: BTreeSet<String> = backticked(text)
            .into_iter()
            .inspect(|m| {
                assert!(
                    all.contains(m),
                    "the folder table allows `{m}`, which it does not list"
                )
            })
            .collect();
        if text.contains("foundation") {
            out.extend(foundation.iter().cloned());
        }
        if text.contains("anything") {
            out.extend(all.iter().cloned());
        }
        out
    };
    let mut table = BTreeMap::new();
    for (modules, _, cell) in &rows {
        let mut allowed = Allowed::default();
        for clause in cell.split(';') {
            match clause.trim().split_once(':') {
                Some((file, rest)) if file.starts_with('`') && file.ends_with(".rs`") => {
                    allowed
                        .per_file
                        .insert(file.trim_matches('`').to_owned(), words(rest));
                }
                _ => allowed.folder.extend(words(clause)),
            }
        }
        for m in modules {
            let previous = table.insert(
                m.clone(),
                Allowed {
                    folder: allowed.folder.clone(),
                    per_file: allowed.per_file.clone(),
                },
            );
            assert!(previous.is_none(), "`{m}` has two rows in the folder table");
        }
    }
    table
}

fn architecture() -> BTreeMap<String, Allowed> {
    architecture_table(&std::fs::read_to_string(root().join("docs/architecture.md")).unwrap())
}

/// Every import in `graph` the table does not allow, as "file imports file".
fn disallowed_imports(
    src: &Path,
    mods: &Modules,
    graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
    table: &BTreeMap<String, Allowed>,
) -> Vec<String> {
    let top = |f: &PathBuf| mods.of_file[f].first().cloned().unwrap_or_default();
    let rel = |f: &PathBuf| f.strip_prefix(src).unwrap().display().to_string();
    let mut bad = Vec::new();
    for (f, deps) in graph {
        let from = top(f);
        if from.is_empty() {
            continue; // lib.rs declares the modules
        }
        let Some(allowed) = table.get(&from) else {
            bad.push(format!(
                "{}: module `{from}` is not in the folder table",
                rel(f)
            ));
            continue;
        };
        let file = f.file_name().unwrap().to_string_lossy().into_owned();
        for d in deps {
            let to = top(d);
            let ok = to == from
                || to.is_empty()
                || allowed.folder.contains(&to)
                || allowed
                    .per_file
                    .get(&file)
                    .is_some_and(|extra| extra.contains(&to));
            if !ok {
                bad.push(format!("{} imports {}", rel(f), rel(d)));
            }
        }
    }
    bad
}

/// The top-level modules' import graph (a module's imports of itself left out).
fn folder_graph(
    mods: &Modules,
    graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let top = |f: &PathBuf| PathBuf::from(mods.of_file[f].first().cloned().unwrap_or_default());
    let mut folders: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (f, deps) in graph {
        let from = top(f);
        let out = folders.entry(from.clone()).or_default();
        out.extend(
            deps.iter()
                .map(top)
                .filter(|t| *t != from && !t.as_os_str().is_empty()),
        );
    }
    folders
}

#[test]
fn every_import_is_one_the_architecture_table_allows() {
    let src = root().join("src");
    let (mods, graph) = imports(&src);
    let bad = disallowed_imports(&src, &mods, &graph, &architecture());
    assert!(
        bad.is_empty(),
        "imports docs/architecture.md's folder table does not allow:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_import_cycle_between_folders() {
    let src = root().join("src");
    let (mods, graph) = imports(&src);
    let found = cycles(&folder_graph(&mods, &graph));
    assert!(
        found.is_empty(),
        "folders that import each other: {found:?}"
    );
}

#[test]
fn the_crate_map_in_lib_rs_names_every_module_of_the_table() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let map: Vec<&str> = lib.lines().filter_map(|l| l.strip_prefix("//! ")).collect();
    let missing: Vec<String> = architecture()
        .keys()
        .filter(|m| {
            !map.iter().any(|l| {
                l.split([' ', ','])
                    .any(|w| w == format!("{m}.rs") || w == format!("{m}/"))
            })
        })
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "src/lib.rs's map does not name {missing:?}"
    );
}

#[test]
fn every_top_level_module_is_in_the_architecture_table_and_every_row_exists() {
    let table = architecture();
    let mut on_disk = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("src")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name != "lib.rs" && name != "main.rs" {
            on_disk.insert(name.trim_end_matches(".rs").to_owned());
        }
    }
    let missing: Vec<_> = on_disk.iter().filter(|m| !table.contains_key(*m)).collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md's folder table does not list {missing:?}"
    );
    let gone: Vec<_> = table.keys().filter(|m| !on_disk.contains(*m)).collect();
    assert!(
        gone.is_empty(),
        "the folder table lists modules that do not exist: {gone:?}"
    );
}

#[test]
fn the_checker_sees_imports_and_cycles() {
    // The rules above pass vacuously if imports are not seen: check the parser on this crate.
    let src = root().join("src");
    let (_, graph) = imports(&src);
    let deps = &graph[&src.join("relay/stream.rs")];
    assert!(deps.contains(&src.join("relay/mod.rs")), "use super::{{…}}");
    assert!(deps.contains(&src.join("source/pgoutput.rs")));
    assert!(
        graph[&src.join("pg/wire_tests.rs")].contains(&src.join("pg/wire.rs")),
        "`#[path] pub(crate) mod tests` is pg::wire::tests, and its `use super::…` is seen"
    );
    assert!(
        graph[&src.join("relay/mod.rs")].contains(&src.join("relay/error.rs")),
        "use error::…"
    );
    let mut a_cycle = BTreeMap::new();
    a_cycle.insert(PathBuf::from("a"), BTreeSet::from([PathBuf::from("b")]));
    a_cycle.insert(PathBuf::from("b"), BTreeSet::from([PathBuf::from("a")]));
    assert_eq!(cycles(&a_cycle).len(), 1);
    // A planted back-arrow (config → relay) breaks both the table and the folder order.
    let (mods, mut planted) = imports(&src);
    planted
        .get_mut(&src.join("config/mod.rs"))
        .unwrap()
        .insert(src.join("relay/mod.rs"));
    let table = architecture();
    assert_eq!(
        disallowed_imports(&src, &mods, &planted, &table),
        ["config/mod.rs imports relay/mod.rs"]
    );
    assert!(!cycles(&folder_graph(&mods, &planted)).is_empty());
    // The table is read as written: a per-file clause allows that file only.
    let cmd = &table["cmd"];
    assert!(!cmd.folder.contains("sandbox") && cmd.per_file["demo.rs"].contains("sandbox"));
    assert!(table["relay"].folder.contains("sink") && !table["config"].folder.contains("pg"));
    let inline = tokens(&code_of("mod tests { use super::*; }"));
    assert_eq!(inline[..3], ["mod", "tests", "{"]);
    assert_eq!(code_of("a // crate::x\n\"crate::y\" b"), "a \n\"\" b");
}

#[test]
fn every_fault_point_is_in_the_table_of_fault_rs() {
    let src = root().join("src");
    let table = std::fs::read_to_string(src.join("fault.rs")).unwrap();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut points = BTreeSet::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for rest in text.split("crash_point!(\"").skip(1) {
            points.insert(rest[..rest.find('"').unwrap()].to_owned());
        }
    }
    assert!(points.len() >= 5, "fault points not seen: {points:?}");
    let missing: Vec<&String> = points
        .iter()
        .filter(|p| !table.contains(&format!("//! | `{p}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "fault points missing from the table in src/fault.rs: {missing:?}"
    );
}

/// Every error type of walbox (a `thiserror::Error` derive under `src/`) says how it is to be
/// treated: fatal with which exit status, or retried (`failure::Classify`). A type without it
/// would be classified by hand wherever it is met, which is how two paths came to disagree.
#[test]
fn every_error_type_implements_classify() {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut code = String::new();
    let mut types = BTreeMap::new();
    for f in &files {
        let text = code_of(&std::fs::read_to_string(f).unwrap());
        let toks = tokens(&text);
        for (i, t) in toks.iter().enumerate() {
            // `#[derive(…, thiserror::Error, …)]` then, past other attributes, `pub enum|struct T`.
            if t != "derive"
                || !toks[i..]
                    .iter()
                    .take_while(|t| *t != "]")
                    .any(|t| t == "Error")
            {
                continue;
            }
            let kind = toks[i..]
                .iter()
                .position(|t| t == "enum" || t == "struct")
                .map(|k| i + k);
            if let Some(name) = kind.and_then(|k| toks.get(k + 1)) {
                types.insert(name.clone(), f.strip_prefix(&src).unwrap().to_owned());
            }
        }
        code.push_str(&text);
        code.push('\n');
    }
    assert!(
        types.len() >= 30
            && types.contains_key("ProgressError")
            && types.contains_key("HistoryError"),
        "error types not seen: {types:?}"
    );
    let toks = tokens(&code);
    let classified: BTreeSet<&String> = toks
        .windows(3)
        .filter(|w| w[0] == "Classify" && w[1] == "for")
        .map(|w| &w[2])
        .collect();
    let missing: Vec<String> = types
        .iter()
        .filter(|(name, _)| !classified.contains(name))
        .map(|(name, file)| format!("{name} ({})", file.display()))
        .collect();
    assert!(
        missing.is_empty(),
        "error types without `impl Classify`: {missing:?}"
    );
}
