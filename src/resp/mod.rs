//! RESP2, the Redis wire protocol, written by hand: no I/O, no allocation on the hot path.
//!
//! # Overview
//!
//! Commands go out as arrays of bulk strings ([`encode`]); replies come back as one of
//! five types, which [`decode()`] parses in place from a byte slice:
//!
//! ```text
//! +OK\r\n                 simple string     Reply::Simple(b"OK")
//! -ERR message\r\n        error             Reply::Error(b"ERR message")
//! :42\r\n                 integer (i64)     Reply::Integer(42)
//! $3\r\nfoo\r\n           bulk string       Reply::Bulk(Some(b"foo"))
//! $-1\r\n                 null bulk         Reply::Bulk(None)
//! *2\r\n:1\r\n:2\r\n      array             Reply::Array(Some(ArrayReply { len: 2, .. }))
//! *-1\r\n                 null array        Reply::Array(None)
//! ```
//!
//! # Invariants
//!
//! - Incomplete input is a value (`Ok(None)`), never an error: the caller reads more and
//!   parses again, from the start of the reply ([`decode()`]: replies on the lock path are
//!   a few bytes) or from where it stopped ([`decode_resume`]: what the connections use,
//!   so a reply trickled in byte by byte costs linear work).
//! - Every length read off the wire is checked against [`Limits`] before it is used, and
//!   all arithmetic on it is checked, so hostile input costs at most the limits.
//! - Only `-1` is a null length; any other negative length is an error.
//! - Nesting is walked with an explicit, bounded stack: no recursion, no stack overflow.
//! - The parser never panics, whatever the bytes.

pub mod decode;
pub mod encode;
mod value;

pub use decode::{ArrayReply, Elements, Progress, ProtocolError, Reply, decode, decode_resume};
pub use value::Value;

/// Bounds on what a server may send, checked before a length is trusted.
///
/// The defaults are generous for a lock client, whose replies are a few bytes, and small
/// enough that a hostile or broken server cannot make the client buffer much.
///
/// # Example
///
/// ```
/// use quorumlock::{Limits, Redlock};
///
/// // A node that sends a bulk string over 64 KiB is cut off with a protocol error.
/// let rl = Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001"])
///     .limits(Limits { max_bulk_len: 64 * 1024, ..Limits::default() })
///     .build()?;
/// # Ok::<(), quorumlock::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest bulk string accepted, in bytes. (The server's `INFO server` text, read
    /// once per connection, may be up to 16 KiB whatever this says.)
    pub max_bulk_len: usize,
    /// Largest array accepted, in elements.
    pub max_array_len: usize,
    /// Deepest nesting of arrays accepted (a flat array has depth 1). Clamped to
    /// `1..=`[`MAX_DEPTH`]: 0 reads as 1.
    pub max_depth: usize,
    /// Longest simple string, error or integer line accepted, in bytes (without CRLF).
    pub max_line_len: usize,
}

/// Hard cap on [`Limits::max_depth`]: the size of the parser's fixed nesting stack.
pub const MAX_DEPTH: usize = 64;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk_len: 1 << 20,
            max_array_len: 1 << 16,
            max_depth: 16,
            max_line_len: 64 * 1024,
        }
    }
}
