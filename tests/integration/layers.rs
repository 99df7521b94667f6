//! The crate's modules depend on each other one way, as `src/lib.rs` draws them: each
//! top-level module of `src/` may name (as `crate::<module>`) only modules on a lower
//! layer below. A new module goes on a layer here; a new import that points up or
//! sideways fails this test instead of quietly making a cycle. Inside a folder the same
//! holds pairwise: no two sibling modules (`http::decide` and `http::remote_config`)
//! import each other, through `super::` or `crate::` paths alike; what both need goes
//! in one of them or a third module. And across the whole tree no two files import
//! each other (a folder's `mod.rs` and a file inside it included).
//!
//! The pipeline reads log -> compactor -> store <- sink: the compactor commits its
//! changes (and the outbox of them) to the store and never names the sink, which reads
//! the store. The two share a layer, so neither may name the other, and
//! [`the_compactor_does_not_know_the_sink`] says so by name.

use std::collections::BTreeSet;
use std::path::Path;

/// Lowest first. A module may use the modules of the layers before its own.
const LAYERS: &[&[&str]] = &[
    &["support", "lz64"],
    &["geoip", "flags"],
    &["manage"],
    &["projects", "config", "log"],
    &["capture"],
    &["persons"],
    &["store"],
    // Both read or write the store; neither names the other.
    &["sink", "compactor", "edge"],
    &["metrics"],
    &["pipeline", "admin", "backup"],
    &["app"],
    &["http"],
    &["server"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The crate's top-level modules the `.rs` files at `path` (a file, or a folder and
/// everything in it) name: `crate::x` paths and the first names of `use crate::{x,
/// y::z}` groups. Line comments are ignored.
fn named_modules(path: &Path, found: &mut BTreeSet<String>) {
    let files: Vec<_> = match path.is_dir() {
        true => std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect(),
        false => vec![path.to_path_buf()],
    };
    for path in files {
        if path.is_dir() {
            named_modules(&path, found);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text: String = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let mut rest = text.as_str();
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            for head in group_heads(rest) {
                found.insert(first_name(&head));
            }
        }
    }
    found.remove("");
}

/// The identifier a path starts with.
fn first_name(path: &str) -> String {
    path.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn modules_depend_only_on_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if ["lib", "main", "cli"].contains(&stem) {
            continue;
        }
        let own = layer(stem).unwrap_or_else(|| {
            panic!("src/{stem} is on no layer: add it to LAYERS in tests/integration/layers.rs")
        });
        let mut used = BTreeSet::new();
        named_modules(&path, &mut used);
        for other in used {
            if other == stem || ["self", "super"].contains(&other.as_str()) {
                continue;
            }
            match layer(&other) {
                Some(l) if l < own => {}
                Some(_) => wrong.push(format!("{stem} uses {other}, which is not below it")),
                // Items of the crate root (crate::Error and the like).
                None => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The compactor writes what the sink sends into the store (`store::outbox`); it
/// must not name the sink, or the sink could no longer be left out or replaced
/// without touching the compactor. Checked here by name as well as by the layers, so
/// moving the sink below the compactor in [`LAYERS`] does not quietly allow it.
#[test]
fn the_compactor_does_not_know_the_sink() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut used = BTreeSet::new();
    named_modules(&src.join("compactor"), &mut used);
    assert!(
        used.contains("store"),
        "the scan found the compactor's imports"
    );
    assert!(
        !used.contains("sink"),
        "src/compactor/ names crate::sink; write to the store (store::outbox) instead"
    );
    assert_eq!(
        layer("sink"),
        layer("compactor"),
        "neither is below the other"
    );
}

/// `src/lib.rs` only maps the crate: its `//!` page, the module declarations and the
/// public API (`pub use`). Code, even one small function, goes in the module it
/// belongs to (running the service: `server`). Every module of `src/` is declared
/// there, so a module cannot hide from this map and the layers above.
#[test]
fn lib_rs_only_maps_the_crate() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let text = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let code: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect();
    let mut declared = BTreeSet::new();
    let mut other = Vec::new();
    for item in code.join("\n").split(';').map(str::trim) {
        // Attributes (`#[cfg(...)]`) may precede an item.
        let mut item = item;
        while let Some(rest) = item.strip_prefix('#') {
            item = rest
                .split_once(']')
                .map_or("", |(_, after)| after)
                .trim_start();
        }
        if let Some(name) = item
            .strip_prefix("pub mod ")
            .or_else(|| item.strip_prefix("mod "))
        {
            declared.insert(name.trim().to_string());
        } else if !item.is_empty() && !item.starts_with("pub use ") {
            other.push(item.to_string());
        }
    }
    assert!(
        other.is_empty(),
        "src/lib.rs holds more than the map; move these into a module: {other:?}"
    );
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if !["lib", "main", "cli"].contains(&stem) {
            modules.insert(stem.to_string());
        }
    }
    assert_eq!(declared, modules, "the modules src/lib.rs declares");
}

/// Past this many lines a source file is split by concern (`src/lib.rs` says so).
const MAX_LINES: usize = 500;

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_is_longer_than_the_limit() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 50, "found only {} files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).unwrap().lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", path.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these by concern: {long:?}");
}

/// The crate root holds the binary, the map, and the service's few top-level pieces
/// (its shared state, settings, metrics and the pipeline of workers); everything else
/// sits in the folder of its concern, so `ls src` reads as the table of contents.
const LOOSE_FILES: &[&str] = &[
    "lib.rs",
    "main.rs",
    "app.rs",
    "config.rs",
    "metrics.rs",
    "pipeline.rs",
];

#[test]
fn src_holds_folders_and_only_the_top_level_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut loose = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            loose.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    loose.sort();
    let mut expected: Vec<String> = LOOSE_FILES.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(
        loose, expected,
        "a new file in src/ belongs in the folder of its concern (or, if it is a top-level piece, in LOOSE_FILES)"
    );
}

/// Unit tests have one home: inline in the file they test (`#[cfg(test)] mod tests {..}`),
/// or, when they outgrow it, a file in the `tests/` folder beside it (`src/log/tests/`,
/// reached with `#[path = "tests/loss.rs"]` from the file tested), never a
/// `x_tests.rs` or `tests.rs` file among the sources.
#[test]
fn unit_test_files_live_in_tests_folders() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let misplaced: Vec<String> = files
        .iter()
        .filter(|path| {
            let name = path.file_name().unwrap().to_string_lossy();
            let in_tests = path
                .parent()
                .and_then(|p| p.file_name())
                .is_some_and(|d| d == "tests");
            (name == "tests.rs" || name.ends_with("_tests.rs")) && !in_tests
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(
        misplaced.is_empty(),
        "move these into the tests/ folder beside them: {misplaced:?}"
    );
    // The rule can see a test file at all: the folders exist and hold files.
    let in_folders = files
        .iter()
        .filter(|p| p.components().any(|c| c.as_os_str() == "tests"))
        .count();
    assert!(
        in_folders > 20,
        "found only {in_folders} test files in tests/ folders"
    );
}

/// A module of `src/` by its path from the crate root (`["http", "decide"]`).
type Module = Vec<String>;

/// One `.rs` file of `src/`: the module whose code it holds (`http/mod.rs` holds
/// `http`), its path from `src/`, and its text.
type File = (Module, String, String);

/// Every module of `src/` (files and folders), and every `.rs` file.
/// Every module of `src/` and every `.rs` file with its module (see [`modules`]).
fn crate_modules() -> (BTreeSet<Module>, Vec<File>) {
    let (mut all, mut files) = (BTreeSet::new(), Vec::new());
    modules(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &Vec::new(),
        &mut all,
        &mut files,
    );
    (all, files)
}

fn modules(dir: &Path, at: &Module, all: &mut BTreeSet<Module>, files: &mut Vec<File>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let mut module = at.clone();
        if path.is_dir() {
            module.push(stem.to_string());
            all.insert(module.clone());
            modules(&path, &module, all, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            if !["mod", "lib", "main"].contains(&stem) {
                module.push(stem.to_string());
                all.insert(module.clone());
            }
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
            let name = path.strip_prefix(&src).unwrap().display().to_string();
            files.push((module, name, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

/// The lines of `text` without line comments, a `use` group that rustfmt spread over
/// several lines (`use a::{` to its `}`) joined into one.
fn joined_lines(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut open = 0i32;
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or("");
        let opens = |l: &str| l.matches('{').count() as i32 - l.matches('}').count() as i32;
        if open > 0 {
            let last = out.last_mut().unwrap();
            last.push(' ');
            last.push_str(line.trim());
            open += opens(line);
            continue;
        }
        let is_use = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .any(|u| line.trim_start().starts_with(u));
        if let Some(at) = line.find("::{").filter(|_| is_use) {
            open = opens(&line[at..]).max(0);
        }
        out.push(line.to_string());
    }
    out
}

/// The module paths one file's code names, as written: `crate::a::b` from the root,
/// `super::a` from the file's module (or, inside an inline `mod x {`, from `x`), each
/// with `use` groups (`super::{a, b::c}`, `crate::a::{b, c::{d, e}}`) expanded. Line
/// comments are ignored.
fn paths_named(own: &Module, text: &str) -> Vec<Module> {
    let mut out = Vec::new();
    // Brace depth, and the depth an inline module opened at, if inside one.
    let (mut depth, mut inline): (i32, Option<i32>) = (0, None);
    for line in joined_lines(text) {
        let line = line.as_str();
        let trimmed = line.trim_start();
        let opens_inline = inline.is_none()
            && (trimmed.starts_with("mod ") || trimmed.starts_with("pub mod "))
            && trimmed.trim_end().ends_with('{');
        if opens_inline {
            inline = Some(depth);
        }
        // Inside an inline module, `super` is the file's own module.
        let mut base = own.clone();
        if inline.is_some() && !opens_inline {
            base.push(String::new());
        }
        for (prefix, from_root) in [("crate::", true), ("super::", false)] {
            let mut rest = line;
            while let Some(at) = rest.find(prefix) {
                let preceded = rest[..at].chars().next_back();
                rest = &rest[at..];
                if preceded.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    rest = &rest[prefix.len()..];
                    continue;
                }
                let mut parent = if from_root { Vec::new() } else { base.clone() };
                if !from_root {
                    while let Some(after) = rest.strip_prefix("super::") {
                        parent.pop();
                        rest = after;
                    }
                } else {
                    rest = &rest[prefix.len()..];
                }
                for name in group_heads(rest) {
                    let mut path = parent.clone();
                    path.extend(name.split("::").map(str::to_string));
                    out.push(path);
                }
            }
        }
        depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
        if inline.is_some_and(|d| depth <= d) {
            inline = None;
        }
    }
    out
}

/// The paths a `use` group or a plain path names: `{a, b::c}` gives `a` and `b::c`,
/// `a::{b, c::{d, self}}` gives `a::b`, `a::c::d` and `a::c`, and `a::b::C` gives
/// itself, each cut at its first character that is not part of a path.
fn group_heads(rest: &str) -> Vec<String> {
    let rest = rest.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        let (mut depth, mut start, mut out) = (0, 0, Vec::new());
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth > 0 => depth -= 1,
                ',' | '}' if depth == 0 => {
                    out.extend(group_heads(&group[start..i]));
                    start = i + 1;
                    if c == '}' {
                        break;
                    }
                }
                _ => {}
            }
        }
        return out;
    }
    let path: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
        .collect();
    let prefix = path.trim_end_matches(':').to_string();
    if path.ends_with("::") && rest[path.len()..].starts_with('{') {
        return group_heads(&rest[path.len()..])
            .into_iter()
            .map(|head| match head.as_str() {
                "self" | "" => prefix.clone(),
                _ => format!("{prefix}::{head}"),
            })
            .collect();
    }
    vec![prefix]
}

#[test]
fn no_two_modules_of_src_import_each_other() {
    let (all, files) = crate_modules();
    assert!(all.contains(&vec!["http".to_string(), "decide".to_string()]));
    // Sibling module -> sibling module it names, from anywhere inside the first.
    let mut edges = BTreeSet::new();
    for (own, _, text) in &files {
        for named in paths_named(own, text) {
            let common = own.iter().zip(&named).take_while(|(a, b)| a == b).count();
            if common >= own.len() || common >= named.len() {
                continue; // A module naming itself, an ancestor or a descendant.
            }
            let from = own[..=common].to_vec();
            let to = named[..=common].to_vec();
            if all.contains(&from) && all.contains(&to) {
                edges.insert((from, to));
            }
        }
    }
    let cycles: Vec<String> = edges
        .iter()
        .filter(|(a, b)| a < b && edges.contains(&(b.clone(), a.clone())))
        .map(|(a, b)| format!("{} and {} import each other", a.join("::"), b.join("::")))
        .collect();
    assert!(cycles.is_empty(), "{}", cycles.join("\n"));
}

/// The file whose code a named path reaches: that of the longest prefix of the path
/// that is a module with a file (`crate::store::outbox::Outbox` is in
/// `store/outbox/mod.rs`), or the crate root's.
fn file_of<'a>(
    named: &Module,
    by_module: &'a std::collections::BTreeMap<&Module, &'a str>,
    root: &'a str,
) -> &'a str {
    (1..=named.len())
        .rev()
        .find_map(|n| by_module.get(&named[..n].to_vec()).copied())
        .unwrap_or(root)
}

/// File-level cycles, which the module-level test above does not see between a
/// folder's `mod.rs` and a file inside it: no two files import each other through
/// `crate::` or `super::` paths. A `mod.rs` naming its children by their bare names
/// (`pub use client::Client`) declares the module tree and is not counted.
#[test]
fn no_two_files_of_src_import_each_other() {
    let (_, files) = crate_modules();
    // `main.rs` and `lib.rs` both hold the root: the library's files name the
    // library's, and the binary's (`main.rs`, `cli/`) the binary's.
    let by_module: std::collections::BTreeMap<&Module, &str> = files
        .iter()
        .filter(|(m, ..)| !m.is_empty())
        .map(|(m, name, _)| (m, name.as_str()))
        .collect();
    let mut edges = BTreeSet::new();
    for (own, name, text) in &files {
        let binary = name == "main.rs" || own.first().is_some_and(|m| m == "cli");
        let root = if binary { "main.rs" } else { "lib.rs" };
        for named in paths_named(own, text) {
            let to = file_of(&named, &by_module, root);
            if to != name {
                edges.insert((name.as_str(), to));
            }
        }
    }
    assert!(
        edges.contains(&("compactor/step.rs", "store/outbox/mod.rs")),
        "the scan resolves paths to files: {edges:?}"
    );
    let cycles: Vec<String> = edges
        .iter()
        .filter(|(a, b)| a < b && edges.contains(&(*b, *a)))
        .map(|(a, b)| format!("src/{a} and src/{b} import each other"))
        .collect();
    assert!(cycles.is_empty(), "{}", cycles.join("\n"));
}
