//! The shape of the crate, checked on its source so that CI fails when it erodes:
//! - **No import cycle.** Among the children of every module (the layers under `src/`, the
//!   parts of each layer, and so on down), the "uses" graph is acyclic. An edge from `a` to
//!   `b` is a path `crate::...` or `super::...` in `a`'s code (comments and unit tests aside)
//!   naming `b` or anything inside it. A module using its own ancestors is not an edge: a
//!   child implements part of its parent (`replicate/db/sync.rs` is `impl Db`).
//! - **Files read in one sitting**: no source file other than unit tests (`tests.rs`) is over
//!   800 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 800;

/// Module path (`["replicate", "db"]`) -> its file.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            out.insert(parts, path);
        }
    }
    out
}

/// The code of a file without comments and without its unit-test module.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => &text,
    };
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path after `prefix` (`crate::` or `super::`), as its identifier segments.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i + prefix.len()..];
        rest = tail;
        if before.is_some_and(|c| is_ident(c) || c == ':') {
            continue;
        }
        if let Some(group) = tail.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                out.extend(paths_after(&format!(" {prefix}{}", item.trim()), prefix));
            }
            continue;
        }
        let mut segs = Vec::new();
        let mut t = tail;
        loop {
            let end = t.find(|c: char| !is_ident(c)).unwrap_or(t.len());
            if end == 0 {
                break;
            }
            segs.push(t[..end].to_string());
            t = &t[end..];
            match t.strip_prefix("::") {
                Some(next) if next.starts_with(|c: char| c.is_ascii_lowercase()) => t = next,
                _ => break,
            }
        }
        if !segs.is_empty() {
            out.push(segs);
        }
    }
    out
}

/// Edges between siblings: (parent, from child, to child).
fn sibling_edges(mods: &BTreeMap<Vec<String>, PathBuf>) -> BTreeSet<(Vec<String>, String, String)> {
    let mut edges = BTreeSet::new();
    for (me, path) in mods {
        if me.iter().any(|m| m == "tests") {
            continue; // unit tests may use anything they test
        }
        let code = code(path);
        let mut targets = paths_after(&code, "crate::");
        if !me.is_empty() {
            let parent = &me[..me.len() - 1];
            for p in paths_after(&code, "super::") {
                targets.push(parent.iter().cloned().chain(p).collect());
            }
        }
        for mut t in targets {
            while !t.is_empty() && !mods.contains_key(&t) {
                t.pop();
            }
            let common = me.iter().zip(&t).take_while(|(a, b)| a == b).count();
            if common == me.len() || common == t.len() {
                continue; // an ancestor or a descendant
            }
            edges.insert((me[..common].to_vec(), me[common].clone(), t[common].clone()));
        }
    }
    edges
}

/// A cycle in `graph`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let at = stack.iter().position(|n| n == next).unwrap_or(0);
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node.as_str())
            && let Some(c) = visit(node, graph, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_import_cycle_between_sibling_modules_or_layers() {
    let mods = modules(&src());
    assert!(mods.len() > 50, "found only {} modules", mods.len());
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (parent, from, to) in sibling_edges(&mods) {
        graphs
            .entry(parent)
            .or_default()
            .entry(from)
            .or_default()
            .insert(to);
    }
    // The layers themselves must be in the graph: the check has something to check.
    let layers = &graphs[&Vec::new()];
    assert!(layers.contains_key("replicate") && layers.contains_key("cli"));
    let cycles: Vec<String> = graphs
        .iter()
        .filter_map(|(parent, g)| {
            find_cycle(g).map(|c| format!("in crate::{}: {}", parent.join("::"), c.join(" -> ")))
        })
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_checker_sees_a_cycle_when_there_is_one() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&g), None);
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        find_cycle(&g),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let code = "use crate::storage::{AnyClient, file};\nuse crate::{ops, util::clock};\n\
                let x = super::sync::go();";
    let names = |v: Vec<Vec<String>>| v.into_iter().map(|p| p.join("::")).collect::<Vec<_>>();
    assert_eq!(
        names(paths_after(code, "crate::")),
        ["storage", "ops", "util::clock"]
    );
    assert_eq!(
        paths_after(code, "super::"),
        vec![vec!["sync".to_string(), "go".to_string()]]
    );
}

#[test]
fn no_source_file_is_over_800_lines_outside_unit_tests() {
    let long: Vec<String> = modules(&src())
        .values()
        .filter(|p| p.file_name().is_some_and(|n| n != "tests.rs"))
        .filter_map(|p| {
            let n = std::fs::read_to_string(p).unwrap().lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:?}");
}
