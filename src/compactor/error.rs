//! Why a compactor step failed: the store's own error, or one of the compactor's, kept
//! apart so a bug of the compactor is not reported as one of sled's.

/// Why [`super::Compactor::step`] failed; the chunk is read again at the next step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the log or reading and writing the store failed.
    #[error(transparent)]
    Store(#[from] sled::Error),
    /// Writing or syncing the event block files failed (a full disk, say).
    #[error("event block files: {0}")]
    Blocks(std::io::Error),
    /// Writing or syncing the layered tables' journal failed (a full disk, say).
    #[error("the tables' journal: {0}")]
    Journal(std::io::Error),
    /// Loading the deduplication window, or reading its segments' files, failed.
    #[error(transparent)]
    Dedup(#[from] crate::store::dedup::Error),
    /// The deduplication window and block counter were not read before a commit.
    #[error("compactor state not loaded")]
    StateNotLoaded,
    /// A test's injected failure aborted the chunk's transaction.
    #[error("injected compactor failure")]
    Injected,
}
