//! Small helpers every layer may use, none of which knows the rest of the crate:
//! the wall clock in the forms the wire uses (`clock`), heaps of their own for what
//! is freed together (`heaps`), what a thread does while it
//! idles (`idle`), the request memory budget and the resident set (`memory`), the service manager's
//! notifications (`notify`), a background thread's nice value (`priority`), large buffers
//! kept between the jobs that fill them (`reuse`), lock
//! helpers that survive a panicked holder (`sync`), the syncs a durability promise
//! rests on, seen by tests (`syncs`), the reload lock and change detection of the
//! files the server reloads by itself (`watch`), a background thread taking jobs
//! (`worker`), bytes as lowercase hex ([`hex`]) and a directory's entries made durable
//! ([`sync_dir`]).

pub mod clock;
pub mod heaps;
pub mod idle;
#[cfg(test)]
pub mod lcg;
pub mod memory;
pub(crate) mod notify;
pub(crate) mod priority;
pub(crate) mod reuse;
pub(crate) mod sync;
pub(crate) mod syncs;
pub(crate) mod watch;
pub(crate) mod worker;

/// Make the entries of `dir` durable (a file created, renamed or removed in it).
pub fn sync_dir(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Bytes as lowercase hex, two digits a byte: key hashes, sled keys in messages.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
