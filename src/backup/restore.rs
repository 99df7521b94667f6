//! `flagpost restore --from BACKUP --db NEWDIR`: check a backup against its manifest
//! (every file present, its size and SHA-256), then make a new database from it: the
//! trees imported into a new sled database, the log's segments and marks and the
//! activity logs copied beside it. Nothing is written before the whole backup checks
//! out, and NEWDIR must be absent or empty, so a restore never mixes two databases.

use std::path::Path;

use super::{sum, Manifest, FORMAT, MANIFEST, TREES, VERSION};

/// Check the backup at `from`: its manifest and every file it lists.
pub fn verify(from: &Path) -> Result<Manifest, String> {
    let path = from.join(MANIFEST);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "{} has no {MANIFEST}: the backup did not finish (the manifest is written last) or this is not a flagpost backup; use another backup",
                from.display()
            ))
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let manifest: Manifest = serde_json::from_slice(&text)
        .map_err(|e| format!("{} is not a flagpost backup manifest: {e}", path.display()))?;
    if manifest.format != FORMAT || manifest.version != VERSION {
        return Err(format!(
            "{} is format {} version {}; this flagpost restores {FORMAT} version {VERSION}",
            path.display(),
            manifest.format,
            manifest.version
        ));
    }
    if !manifest.files.iter().any(|f| f.path == TREES) {
        return Err(format!("{} lists no {TREES}", path.display()));
    }
    for listed in &manifest.files {
        if listed
            .path
            .split('/')
            .any(|part| part == ".." || part.is_empty())
        {
            return Err(format!(
                "{} lists a path outside the backup: {}",
                path.display(),
                listed.path
            ));
        }
        let found = sum(from, &listed.path).map_err(|e| {
            format!(
                "{} is missing or unreadable ({e}): the backup is incomplete; use another backup",
                from.join(&listed.path).display()
            )
        })?;
        if found.bytes != listed.bytes {
            return Err(format!(
                "{} is {} bytes, the manifest says {}: the backup is damaged or incomplete; use another backup",
                from.join(&listed.path).display(),
                found.bytes,
                listed.bytes
            ));
        }
        if found.sha256 != listed.sha256 {
            return Err(format!(
                "{} does not match its checksum in the manifest: the backup is damaged; use another backup",
                from.join(&listed.path).display()
            ));
        }
    }
    Ok(manifest)
}

/// Check the backup at `from` and make a new database at `db` from it.
pub fn restore(from: &Path, db: &Path) -> Result<Manifest, String> {
    let manifest = verify(from)?;
    super::empty_dir(db)?;
    let failed = |e: String| {
        format!(
            "{e}; {} is left incomplete: remove it before trying again",
            db.display()
        )
    };
    let sled_db = crate::store::check::open(db, crate::config::DEFAULT_CACHE_BYTES)
        .map_err(|e| failed(format!("cannot create the database: {e}")))?;
    let files = crate::store::block::Files::open(db)
        .map_err(|e| failed(format!("cannot create the event block files: {e}")))?;
    let counts = super::trees::import(&from.join(TREES), &sled_db, &files).map_err(failed)?;
    files
        .finish()
        .map_err(|e| failed(format!("cannot write the event block files: {e}")))?;
    if counts != manifest.trees {
        return Err(failed(format!(
            "{TREES} holds other trees than the manifest lists"
        )));
    }
    sled_db
        .flush()
        .map_err(|e| failed(format!("cannot write the database: {e}")))?;
    drop(sled_db);
    let mut dirs = std::collections::BTreeSet::new();
    for listed in manifest.files.iter().filter(|f| f.path != TREES) {
        let target = db.join(&listed.path);
        let mut copy = || -> std::io::Result<()> {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
                dirs.insert(parent.to_path_buf());
            }
            std::fs::copy(from.join(&listed.path), &target)?;
            std::fs::File::open(&target)?.sync_all()
        };
        copy().map_err(|e| failed(format!("cannot write {}: {e}", target.display())))?;
    }
    dirs.insert(db.to_path_buf());
    for dir in dirs {
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| failed(format!("cannot sync {}: {e}", dir.display())))?;
    }
    Ok(manifest)
}
