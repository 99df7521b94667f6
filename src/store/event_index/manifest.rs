//! The event index's manifest: which run files make the index and which block ids it
//! covers. Written whole to a new file, synced, renamed over the old one and the
//! directory synced, so a crash leaves the old manifest or the new, never a mix; a
//! run file is deleted only after a synced manifest no longer names it.
//!
//! Text, one item a line: `flagpost event index 3`, `covered N` (every block id below
//! N is in the runs), `next N` (the number the next run file takes), then `run N` for
//! each run, its file being `N.run`. Version 1 named runs of distinct ids only and
//! version 2 runs without property keys (see [`super::run`]): such an index is set
//! aside and built again.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

const NAME: &str = "MANIFEST";
const MAKING: &str = "MANIFEST.new";
const HEADER: &str = "flagpost event index 3";
/// The header of the versions before, whose runs are set aside.
const OLDER: &[&str] = &["flagpost event index 1", "flagpost event index 2"];

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Every block id below this is in the runs.
    pub covered: u64,
    /// The number of the next run file.
    pub next: u64,
    pub runs: Vec<u64>,
}

pub fn run_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("{number}.run"))
}

fn bad(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("event index manifest: {why}"),
    )
}

impl Manifest {
    /// The manifest in `dir`; an empty one when there is none yet.
    pub fn load(dir: &Path) -> io::Result<Manifest> {
        let text = match fs::read_to_string(dir.join(NAME)) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Manifest::default()),
            Err(e) => return Err(e),
        };
        let mut lines = text.lines();
        match lines.next() {
            Some(HEADER) => {}
            Some(older) if OLDER.contains(&older) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("event index of an older format ({older})"),
                ))
            }
            _ => return Err(bad("not of this version")),
        }
        let mut m = Manifest::default();
        for line in lines {
            let (what, n) = line.split_once(' ').ok_or_else(|| bad(line))?;
            let n: u64 = n.parse().map_err(|_| bad(line))?;
            match what {
                "covered" => m.covered = n,
                "next" => m.next = n,
                "run" => m.runs.push(n),
                _ => return Err(bad(line)),
            }
        }
        Ok(m)
    }

    /// Replace the manifest in `dir` with this one, durably.
    pub fn store(&self, dir: &Path) -> io::Result<()> {
        let mut text = format!("{HEADER}\ncovered {}\nnext {}\n", self.covered, self.next);
        for r in &self.runs {
            text.push_str(&format!("run {r}\n"));
        }
        let making = dir.join(MAKING);
        let mut f = File::create(&making)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&making, dir.join(NAME))?;
        File::open(dir)?.sync_all()
    }

    /// Remove the files of `dir` this manifest does not name: runs of a fold or merge
    /// a crash interrupted, or replaced by a merge whose manifest was stored.
    pub fn remove_strays(&self, dir: &Path) -> io::Result<usize> {
        let mut removed = 0;
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            let named = name
                .strip_suffix(".run")
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| self.runs.contains(&n));
            if name != NAME && !named {
                super::run::remove(&dir.join(&*name))?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_reads_back_and_names_its_runs_only() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), Manifest::default());
        let m = Manifest {
            covered: 812,
            next: 9,
            runs: vec![3, 8],
        };
        m.store(dir.path()).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), m);
        for name in ["3.run", "5.run", "8.run", "9.run.new"] {
            fs::write(dir.path().join(name), b"x").unwrap();
        }
        assert_eq!(m.remove_strays(dir.path()).unwrap(), 2);
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["3.run", "8.run", "MANIFEST"]);
        fs::write(dir.path().join(NAME), "something else\n").unwrap();
        let e = Manifest::load(dir.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        fs::write(dir.path().join(NAME), "flagpost event index 1\ncovered 8\n").unwrap();
        let e = Manifest::load(dir.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
    }
}
