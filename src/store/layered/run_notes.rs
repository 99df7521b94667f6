//! What readers noted of a run's blocks, kept while the run is open.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;

/// Bytes of notes every open run keeps at most together (see [`Notes`]): about 60,000
/// blocks' notes of a search of persons by property, the blocks of three keys every
/// one of a million persons has.
const MAX_NOTE_BYTES: usize = 16 << 20;
/// Bytes of notes the open runs keep.
static NOTE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// What a reader noted of a block it read ([`super::super::Visitor::note`]).
pub type Note = Box<dyn Any + Send + Sync>;

/// The notes readers made of a run's blocks, by block: a run never changes, so a note
/// stays true while it is open, and a later visit asks its reader whether the note
/// lets it leave the block unread ([`super::super::Visitor::pass_over_noted`]). Kept in
/// memory only, within [`MAX_NOTE_BYTES`] for every run together (a note past it is
/// not kept); they go with the run when a fold replaces it.
#[derive(Default)]
pub(super) struct Notes {
    by_block: RwLock<HashMap<u32, Note>>,
    /// Their bytes, counted in [`NOTE_BYTES`] too.
    bytes: AtomicUsize,
}

impl std::fmt::Debug for Notes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Notes({} bytes)", self.bytes.load(Ordering::Relaxed))
    }
}

impl Drop for Notes {
    fn drop(&mut self) {
        NOTE_BYTES.fetch_sub(*self.bytes.get_mut(), Ordering::Relaxed);
    }
}

impl Notes {
    /// `f` of the note kept of block `i`, if one is.
    pub(super) fn with<R>(
        &self,
        i: usize,
        f: impl FnOnce(&(dyn Any + Send + Sync)) -> R,
    ) -> Option<R> {
        let notes = self.by_block.read().unwrap_or_else(|e| e.into_inner());
        notes.get(&(i as u32)).map(|n| f(n.as_ref()))
    }

    /// Keep `note` of block `i`, unless the notes of every run are at their bound.
    pub(super) fn keep(&self, i: usize, note: Note) {
        // The note's own bytes and about what a map's entry of it costs.
        let bytes = std::mem::size_of_val(note.as_ref()) + 32;
        if NOTE_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes > MAX_NOTE_BYTES {
            NOTE_BYTES.fetch_sub(bytes, Ordering::Relaxed);
            return;
        }
        let mut notes = self.by_block.write().unwrap_or_else(|e| e.into_inner());
        match notes.insert(i as u32, note) {
            // Noted twice at once: the first one's bytes were counted already.
            Some(_) => NOTE_BYTES.fetch_sub(bytes, Ordering::Relaxed),
            None => self.bytes.fetch_add(bytes, Ordering::Relaxed),
        };
    }

    /// The bytes its notes take.
    pub(super) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}
