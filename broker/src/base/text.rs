//! Text that came from outside (a caller's request, a ClusterProfile, a wrapped plugin, an
//! upstream's answer) on its way into an error message or a log line: truncated, and with
//! every control character escaped, so that it can neither forge a log line (a newline, a
//! carriage return), nor drive a terminal (ESC), nor grow a message without bound.
//!
//! JSON logs escape control characters themselves, but the text format and gRPC status
//! messages (which travel in HTTP/2 trailers with a size limit, and end up on the shim's one
//! stderr line) do not: every piece of outside text goes through [`quote`] or [`one_line`].
//!
//! The rule itself lives in `credbroker_proto::text`, which the shim links too: it escapes
//! its error line (the broker's messages included) the same way.

pub use credbroker_proto::text::{MAX_QUOTED_CHARS, controls_escaped, one_line, quote};
