//! The waiting room's visitor-facing side: the page people see while in line
//! and the path they are sent back to.

pub mod page;
pub mod return_to;
