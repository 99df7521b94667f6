//! Edge mode (`serve --upstream`) against real servers on loopback: a second flagpost
//! as the upstream, and a scriptable recording fake where a flagpost cannot act a part.

mod fake;
mod forward;
