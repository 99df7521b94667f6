//! Edge mode (issues 39 and 40): one file per part, each against real servers on
//! loopback with scriptable fakes where a flagpost upstream cannot act a part.

mod eval;
