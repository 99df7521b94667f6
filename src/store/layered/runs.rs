//! A table's runs: its key space cut into ranges, each range held by one immutable
//! [`Run`] file, so a fold rewrites only the ranges its delta touched
//! ([`super::plan`]). Part `i` holds the keys from its lower bound up to the next
//! part's; the first part's bound is the empty key. One `Arc`'d [`Runs`] is the view
//! readers load, so none sees half a switch.
//!
//! The set is named by the table's manifest, `<table>.manifest` in the runs'
//! directory, never by listing the directory: a fold writes its new runs, syncs them,
//! writes the manifest beside (`.manifest.new`), syncs it, renames it into place and
//! syncs the directory; only then are the replaced runs deleted. A crash before the
//! rename leaves runs no manifest names, removed at the next start. A table without a
//! manifest (a database of format 5 or earlier) is the newest `.run` file alone.
//!
//! ```text
//! flagpost-manifest 1
//! <lower bound in hex, or -> <file name>      one line a part, in key order
//! end <crc32 of the lines above, hex>
//! ```

use std::fs;
use std::io::{self, Write};
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use super::run::{Entry, Run};

const MANIFEST_MAGIC: &str = "flagpost-manifest 1";
pub(super) const MANIFEST_SUFFIX: &str = ".manifest";
pub(super) const MANIFEST_MAKING_SUFFIX: &str = ".manifest.new";

/// A manifest's parts: (lower bound, file name), in key order.
pub(super) type Named = Vec<(Box<[u8]>, String)>;

/// One range of the table and the run holding it.
#[derive(Debug, Clone)]
pub struct Part {
    /// The least key it may hold; the next part's bound ends it.
    pub lower: Box<[u8]>,
    /// Its file's name in the runs' directory.
    pub file: String,
    pub run: Arc<Run>,
}

/// The runs of a table, in key order.
#[derive(Debug, Default)]
pub struct Runs {
    parts: Vec<Part>,
}

impl Runs {
    pub fn new(parts: Vec<Part>) -> Runs {
        Runs { parts }
    }

    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The part whose range holds `key` (0 when there is none).
    pub fn part_of(&self, key: &[u8]) -> usize {
        self.parts.partition_point(|p| &*p.lower <= key).max(1) - 1
    }

    /// The value of `key`, if a run holds it.
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.parts.get(self.part_of(key))?.run.get(key)
    }

    /// Up to `limit` entries from `from` on (and below `to`), in key order.
    pub fn scan(&self, from: Bound<&[u8]>, to: Bound<&[u8]>, limit: usize) -> Vec<Entry> {
        let first = match from {
            Bound::Unbounded => 0,
            Bound::Included(k) | Bound::Excluded(k) => self.part_of(k),
        };
        let mut out = Vec::new();
        for part in self.parts.iter().skip(first) {
            let past_end = match to {
                Bound::Unbounded => false,
                Bound::Included(t) => &*part.lower > t,
                Bound::Excluded(t) => &*part.lower >= t,
            };
            if past_end || out.len() >= limit {
                break;
            }
            out.extend(part.run.scan(from, to, limit - out.len()));
        }
        out
    }

    /// Keys in every run.
    pub fn entries(&self) -> u64 {
        self.parts.iter().map(|p| p.run.entries()).sum()
    }

    /// Bytes of their keys and values, uncompressed.
    pub fn raw_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.run.raw_bytes()).sum()
    }

    /// Bytes their block indexes and filters keep in memory.
    pub fn resident_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.run.resident_bytes()).sum()
    }

    /// Bytes of their files.
    pub fn file_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.run.file_bytes()).sum()
    }

    /// Whether a read met a damaged block in any run.
    pub fn damage_seen(&self) -> bool {
        self.parts.iter().any(|p| p.run.damage_seen())
    }

    /// Read every block of every run: the entries, or the first damage met (a key
    /// outside its part's range is damage too).
    pub fn verify(&self) -> io::Result<u64> {
        let mut count = 0;
        for (i, part) in self.parts.iter().enumerate() {
            count += part.run.verify()?;
            let upper = self.parts.get(i + 1).map(|p| &*p.lower);
            let first = part.run.scan(Bound::Unbounded, Bound::Unbounded, 1);
            let last = upper.map(|u| part.run.scan(Bound::Included(u), Bound::Unbounded, 1));
            let below = first
                .first()
                .is_some_and(|(k, _)| k.as_slice() < &*part.lower);
            if below || last.is_some_and(|l| !l.is_empty()) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} is damaged: it holds keys outside its range",
                        part.run.path().display()
                    ),
                ));
            }
        }
        Ok(count)
    }
}

/// The manifest's path for table `name`.
pub(super) fn manifest_path(dir: &Path, name: &str, making: bool) -> std::path::PathBuf {
    let suffix = if making {
        MANIFEST_MAKING_SUFFIX
    } else {
        MANIFEST_SUFFIX
    };
    dir.join(format!("{name}{suffix}"))
}

/// The manifest's text for `parts` (lower bound, file name).
pub(super) fn encode<'a>(parts: impl Iterator<Item = (&'a [u8], &'a str)>) -> String {
    let mut body = format!("{MANIFEST_MAGIC}\n");
    for (lower, file) in parts {
        let bound = match lower.is_empty() {
            true => "-".to_owned(),
            false => lower.iter().map(|b| format!("{b:02x}")).collect(),
        };
        body.push_str(&format!("{bound} {file}\n"));
    }
    let crc = crc32fast::hash(body.as_bytes());
    body.push_str(&format!("end {crc:08x}\n"));
    body
}

/// The parts a manifest names (lower bound, file name), or `None` when the table has
/// no manifest. A manifest that does not read whole is an error: its table cannot be
/// known.
pub(super) fn read(dir: &Path, name: &str) -> io::Result<Option<Named>> {
    let path = manifest_path(dir, name, false);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is damaged: {what}", path.display()),
        )
    };
    let body_end = text.rfind("end ").ok_or_else(|| bad("it is cut"))?;
    let (body, end) = text.split_at(body_end);
    let crc = end
        .trim_end()
        .strip_prefix("end ")
        .and_then(|c| u32::from_str_radix(c, 16).ok())
        .ok_or_else(|| bad("its last line is not whole"))?;
    if crc32fast::hash(body.as_bytes()) != crc {
        return Err(bad("it fails its CRC"));
    }
    let mut lines = body.lines();
    if lines.next() != Some(MANIFEST_MAGIC) {
        return Err(bad("it does not start as a manifest"));
    }
    let mut parts: Named = Vec::new();
    for line in lines {
        let (bound, file) = line.split_once(' ').ok_or_else(|| bad("a line is cut"))?;
        let lower = match bound {
            "-" => Vec::new(),
            hex => decode_hex(hex).ok_or_else(|| bad("a bound is not hex"))?,
        };
        let ordered = match parts.last() {
            Some((prev, _)) => **prev < *lower,
            None => lower.is_empty(),
        };
        if !ordered || file.contains('/') || file.is_empty() {
            return Err(bad("its parts are out of order"));
        }
        parts.push((lower.into(), file.to_owned()));
    }
    Ok(Some(parts))
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if hex.is_empty() || !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Write `text` as the manifest being made, synced through `sync`.
pub(super) fn write_making(
    dir: &Path,
    name: &str,
    text: &str,
    sync: impl FnOnce(&fs::File) -> io::Result<()>,
) -> io::Result<()> {
    let mut file = fs::File::create(manifest_path(dir, name, true))?;
    file.write_all(text.as_bytes())?;
    sync(&file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_reads_back_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let parts: Vec<(&[u8], &str)> = vec![(b"", "t.0000000001.part"), (b"\x00\xffk", "t.2")];
        let text = encode(parts.iter().copied());
        fs::write(manifest_path(dir.path(), "t", false), &text).unwrap();
        let read_back = read(dir.path(), "t").unwrap().unwrap();
        let got: Vec<(&[u8], &str)> = read_back.iter().map(|(l, f)| (&**l, f.as_str())).collect();
        assert_eq!(got, parts);
        assert!(read(dir.path(), "other").unwrap().is_none());
        for bad in [
            text.replace("t.2", "t.3"),
            text[..text.len() - 4].to_owned(),
            text.replace("00ff6b", "6b"),
        ] {
            fs::write(manifest_path(dir.path(), "t", false), bad).unwrap();
            let err = read(dir.path(), "t").unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        }
    }
}
