//! The crate's modules depend on each other one way, as `src/lib.rs` draws them: each
//! top-level module of `src/` may name (as `crate::<module>`) only modules on a lower
//! layer below. A new module goes on a layer here; a new import that points up or
//! sideways fails this test instead of quietly making a cycle.

use std::collections::BTreeSet;
use std::path::Path;

/// Lowest first. A module may use the modules of the layers before its own.
const LAYERS: &[&[&str]] = &[
    &["sync", "idle", "notify", "clock", "lz64", "memory"],
    &["watch"],
    &["geoip", "flags"],
    &["client_config", "catalog", "manage"],
    &["projects", "surveys", "early_access", "config", "log"],
    &["capture"],
    &["persons"],
    &["store"],
    &["sink"],
    &["compactor", "metrics"],
    &["pipeline", "admin"],
    &["app"],
    &["http"],
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
            match rest.strip_prefix('{') {
                Some(group) => {
                    // The group's top-level items, each up to its first `::`.
                    let (mut depth, mut start) = (0, 0);
                    for (i, c) in group.char_indices() {
                        match c {
                            '{' => depth += 1,
                            '}' if depth > 0 => depth -= 1,
                            ',' | '}' if depth == 0 => {
                                found.insert(first_name(&group[start..i]));
                                start = i + 1;
                                if c == '}' {
                                    break;
                                }
                            }
                            _ => {}
                        }
                    }
                }
                None => {
                    found.insert(first_name(rest));
                }
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
