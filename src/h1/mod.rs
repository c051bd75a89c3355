//! The HTTP/1 codec: heads parsed once with `httparse` into borrowed views,
//! and the framing of their bodies. Byte work only: no sockets, no timers.
//!
//! - `request`: a client's request head and its body's framing (RFC 9112),
//!   refusing what hyper's server refuses and what two parsers could frame
//!   differently.

pub mod request;
