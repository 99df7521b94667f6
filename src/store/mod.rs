//! Embedded storage: one sled database holding the write-ahead log and everything the
//! compactor derives from it. Opening it starts the log's writer thread.

pub mod record;
pub mod wal;

use std::path::Path;

pub use record::Record;
pub use wal::Wal;

/// sled's page cache. Its memory use can exceed this, so it is kept modest.
const CACHE_CAPACITY_BYTES: u64 = 64 * 1024 * 1024;

/// Tree names, part of the on-disk format.
pub const WAL_TREE: &str = "wal";

#[derive(Debug)]
pub struct Error(sled::Error);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "storage: {}", self.0)
    }
}

impl std::error::Error for Error {}

impl From<sled::Error> for Error {
    fn from(e: sled::Error) -> Self {
        Error(e)
    }
}

/// The open database and its log.
pub struct Store {
    pub db: sled::Db,
    pub wal_tree: sled::Tree,
    pub wal: Wal,
    writer: wal::Writer,
}

impl Store {
    pub fn open(dir: &Path) -> Result<Store, Error> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_CAPACITY_BYTES)
            .open()?;
        let wal_tree = db.open_tree(WAL_TREE)?;
        let (wal, writer) =
            Wal::start(db.clone(), wal_tree.clone()).map_err(|e| Error(sled::Error::Io(e)))?;
        Ok(Store {
            db,
            wal_tree,
            wal,
            writer,
        })
    }

    /// Write what the log has queued, stop its writer and flush whatever else is
    /// dirty. Appends after this fail as closed. Blocking: call off the reactor.
    pub fn close(self) -> Result<(), Error> {
        let Store { db, writer, .. } = self;
        writer.stop();
        db.flush()?;
        Ok(())
    }
}
