//! Edge mode (`serve --upstream URL`) end to end, one file per part, each against a
//! second flagpost as the upstream or a scriptable fake where a flagpost cannot act
//! the part.

mod eval;
mod fake;
mod forward;
mod ingest;
mod sync;
mod wire;
