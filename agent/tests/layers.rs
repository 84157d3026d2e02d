//! The agent's floors: every module of `agent/src` is on one layer, and imports only
//! from its own layer or below (and the top-level modules import one another without a
//! circle). Bottom to top:
//!
//! 0. declarative: the config file's types, the watermark grammar, schema, errors
//! 1. dialect: SQL text per engine (pure, golden-tested)
//! 2. connector: drivers, pools, row building, the throttle
//! 3. dataset: reading a dataset (aggregates, digests, reveals, watermark reads)
//! 4. service: policy, release, sealing, measures, the gRPC service and server
//!
//! A reference is any `crate::<module>` path outside a comment, test modules included.
//! No file is longer than [`MAX_LINES`] lines before its `#[cfg(test)]` module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const LAYERS: &[(&str, &[&str])] = &[
    (
        "declarative",
        &["config", "files", "watermark", "schema", "error"],
    ),
    ("dialect", &["dialect"]),
    ("connector", &["connector"]),
    ("dataset", &["dataset", "hash_pipe"]),
    (
        "service",
        &[
            "measures",
            "policy",
            "release",
            "release_log",
            "reveal_budget",
            "sealing",
            "service",
            "server",
            "tls",
            "sample_data",
            "lib",
            "main",
        ],
    ),
];

/// The most lines a file of `agent/src` has before its tests.
const MAX_LINES: usize = 800;

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, ms)| ms.contains(&module))
}

/// The top-level module a file under `src` belongs to (`connector/mysql.rs` ->
/// `connector`, `lib.rs` -> `lib`).
fn module_of(rel: &Path) -> String {
    let first = rel.components().next().expect("a path under src");
    let first = first.as_os_str().to_string_lossy();
    first.strip_suffix(".rs").unwrap_or(&first).to_string()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The top-level modules a file's code names through `crate::` (`$crate::` too), with
/// the line each is named on. `crate::{a, b::c}` names `a` and `b`.
fn references(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let code = match code.find(" //") {
            Some(i) => &code[..i],
            None => code,
        };
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let before = rest[..i].chars().next_back();
            let after = &rest[i + "crate::".len()..];
            rest = after;
            if before.is_some_and(is_ident) {
                continue; // `tally_crate::`, not this crate
            }
            if let Some(group) = after.strip_prefix('{') {
                // the first name of each comma-separated item at the group's depth
                let mut depth = 0;
                let mut item_start = true;
                let mut name = String::new();
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => item_start = true,
                        c if item_start && depth == 0 && is_ident(c) => name.push(c),
                        _ if item_start && !name.is_empty() => {
                            out.push((n + 1, std::mem::take(&mut name)));
                            item_start = false;
                        }
                        _ => {}
                    }
                }
                if !name.is_empty() {
                    out.push((n + 1, name));
                }
            } else {
                let name: String = after.chars().take_while(|&c| is_ident(c)).collect();
                if !name.is_empty() {
                    out.push((n + 1, name));
                }
            }
        }
    }
    out
}

/// Every rule broken by `files` (path under `src`, text): a module not in the table, an
/// import from a higher layer, an import circle between top-level modules.
fn violations(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in files {
        let module = module_of(rel);
        let Some(own) = layer_of(&module) else {
            out.push(format!(
                "src/{}: module {module} is in no layer of tests/layers.rs",
                rel.display()
            ));
            continue;
        };
        for (line, target) in references(text) {
            if target == module || target == "self" || target == "super" {
                continue;
            }
            match layer_of(&target) {
                None => out.push(format!(
                    "src/{}:{line}: crate::{target}: module {target} is in no layer of tests/layers.rs",
                    rel.display()
                )),
                Some(l) if l > own => out.push(format!(
                    "src/{}:{line}: crate::{target} imports layer {} ({}) from layer {own} ({}) module {module}",
                    rel.display(),
                    l,
                    LAYERS[l].0,
                    LAYERS[own].0
                )),
                Some(_) => {
                    edges.entry(module.clone()).or_default().insert(target);
                }
            }
        }
    }
    // a circle within a layer: a path from a module back to itself
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((m, path)) = stack.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                if next == start {
                    let mut circle = path.clone();
                    circle.push(start.clone());
                    out.push(format!("import circle: {}", circle.join(" -> ")));
                } else if seen.insert(next.clone()) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn sources(dir: &Path, root: &Path, out: &mut Vec<(PathBuf, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            sources(&p, root, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            out.push((p.strip_prefix(root).expect("under src").to_path_buf(), text));
        }
    }
}

fn agent_sources() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    files
}

#[test]
fn every_module_imports_only_its_own_layer_or_below() {
    let files = agent_sources();
    assert!(files.len() > 30, "read {} files of agent/src", files.len());
    let v = violations(&files);
    assert!(v.is_empty(), "the agent's layers are broken:\n{}", v.join("\n"));
}

#[test]
fn no_file_is_longer_than_800_lines_before_its_tests() {
    let long: Vec<String> = agent_sources()
        .iter()
        .filter_map(|(p, text)| {
            let lines = text
                .lines()
                .position(|l| l.trim() == "#[cfg(test)]")
                .unwrap_or_else(|| text.lines().count());
            (lines > MAX_LINES).then(|| format!("src/{}: {lines} lines", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these files:\n{}", long.join("\n"));
}

#[test]
fn a_dialect_that_reads_a_dataset_is_named_with_its_file_and_import() {
    let mut files = agent_sources();
    let (_, text) = files
        .iter_mut()
        .find(|(p, _)| p == Path::new("dialect/postgres.rs"))
        .expect("dialect/postgres.rs");
    text.push_str("\nuse crate::dataset::Dataset;\n");
    let v = violations(&files);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("src/dialect/postgres.rs:")
            && v[0].contains("crate::dataset")
            && v[0].contains("layer 3 (dataset)")
            && v[0].contains("layer 1 (dialect)"),
        "{}",
        v[0]
    );
}

#[test]
fn grouped_and_macro_imports_count_and_comments_do_not() {
    let refs = |t: &str| references(t).into_iter().map(|(_, m)| m).collect::<Vec<_>>();
    assert_eq!(
        refs("use crate::{error::Result, dataset::{Dataset, Bound}, schema};"),
        ["error", "dataset", "schema"]
    );
    assert_eq!(refs("impl $crate::connector::EngineConn for X {}"), ["connector"]);
    assert_eq!(refs("pub(crate) fn f() {}"), Vec::<String>::new());
    assert_eq!(refs("/// see [`crate::service`]"), Vec::<String>::new());
    assert_eq!(refs("let x = 1; // crate::service"), Vec::<String>::new());
}

#[test]
fn a_module_in_no_layer_and_a_circle_are_named() {
    let f = |p: &str, t: &str| (PathBuf::from(p), t.to_string());
    let v = violations(&[f("cache.rs", "use crate::error::Result;\n")]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("src/cache.rs: module cache"), "{}", v[0]);
    let v = violations(&[
        f("policy.rs", "use crate::sealing::Zone;\n"),
        f("sealing.rs", "use crate::policy;\n"),
    ]);
    assert!(v.iter().any(|l| l.starts_with("import circle: ")), "{v:?}");
}
