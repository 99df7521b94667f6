//! The files of the runs' directory that belong to a table, whatever their state:
//! the runs a manifest names, a run of a table older than manifests, and one a build
//! of that time was making. A start keeps the ones its manifest names and removes the
//! others ([`super::Layered::remove_strays`]).

use std::fs;
use std::io;
use std::path::Path;

/// A run of a table without a manifest (format 5 and earlier), and one being made.
const RUN_SUFFIX: &str = ".run";
const MAKING_SUFFIX: &str = ".run.new";
/// A run a manifest names.
const PART_SUFFIX: &str = ".part";

/// What a file of the runs' directory is to a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A run of a table without a manifest.
    Run,
    /// A run being made by a build before manifests.
    Making,
    /// A run a manifest may name.
    Part,
}

pub(super) struct Listed {
    pub(super) file: String,
    pub(super) generation: u64,
    pub(super) kind: Kind,
}

/// The name of a new run of `name`.
pub(super) fn part_file(name: &str, generation: u64) -> String {
    format!("{name}.{generation:010}{PART_SUFFIX}")
}

/// The runs of `name` in `dir`, whatever their state.
pub(super) fn list(dir: &Path, name: &str) -> io::Result<Vec<Listed>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let file = entry?.file_name();
        let Some(file) = file.to_str() else { continue };
        let Some(rest) = file.strip_prefix(name).and_then(|f| f.strip_prefix('.')) else {
            continue;
        };
        let kinds = [
            (MAKING_SUFFIX, Kind::Making),
            (RUN_SUFFIX, Kind::Run),
            (PART_SUFFIX, Kind::Part),
        ];
        let Some((digits, kind)) = kinds
            .iter()
            .find_map(|(suffix, kind)| Some((rest.strip_suffix(suffix)?, *kind)))
        else {
            continue;
        };
        if digits.len() == 10 && digits.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(generation) = digits.parse() {
                let file = file.to_owned();
                out.push(Listed {
                    file,
                    generation,
                    kind,
                });
            }
        }
    }
    Ok(out)
}
