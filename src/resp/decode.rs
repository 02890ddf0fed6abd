//! The reply parser: `&[u8]` in, a borrowed [`Reply`] and the bytes it used out.
//!
//! A reply that is not all there yet is `Ok(None)`; the caller appends what the socket
//! gives and calls again. [`decode`] restarts from the first byte of the reply on every
//! call (replies on the lock path are a few bytes); [`decode_resume`] keeps a
//! [`Progress`] between calls and resumes where the last call stopped, so a hostile
//! server that trickles a large array or a long line one byte at a time costs work in
//! proportion to its bytes, not to their square. Arrays are validated whole before they
//! are returned, so walking an [`ArrayReply`] afterwards cannot fail.

use super::{Limits, MAX_DEPTH};
use std::fmt;

/// One parsed reply, borrowing from the input buffer.
///
/// # Example
///
/// ```
/// use quorumlock::__private::resp::{decode, Limits, Reply};
///
/// let input = b"+OK\r\n$-1\r\n";
/// let (reply, used) = decode(input, &Limits::default()).unwrap().unwrap();
/// assert_eq!(reply, Reply::Simple(b"OK"));
/// let (next, _) = decode(&input[used..], &Limits::default()).unwrap().unwrap();
/// assert_eq!(next, Reply::Bulk(None));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// `+...`: a status line such as `OK`.
    Simple(&'a [u8]),
    /// `-...`: an error line such as `NOSCRIPT No matching script`.
    Error(&'a [u8]),
    /// `:...`: a signed 64-bit integer.
    Integer(i64),
    /// `$...`: a binary-safe string; `None` is the null bulk string `$-1`.
    Bulk(Option<&'a [u8]>),
    /// `*...`: an array; `None` is the null array `*-1`.
    Array(Option<ArrayReply<'a>>),
}

/// An array reply whose elements have been validated but not yet materialised.
///
/// Iterating it parses the elements in place, without allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayReply<'a> {
    len: usize,
    // INVARIANT: `body` is exactly `len` complete, valid replies back to back.
    body: &'a [u8],
}

impl<'a> ArrayReply<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for `*0`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements, in order.
    pub fn iter(&self) -> Elements<'a> {
        Elements {
            rest: self.len,
            body: self.body,
        }
    }
}

impl<'a> IntoIterator for ArrayReply<'a> {
    type Item = Reply<'a>;
    type IntoIter = Elements<'a>;
    fn into_iter(self) -> Elements<'a> {
        self.iter()
    }
}

/// Iterator over the elements of an [`ArrayReply`].
#[derive(Clone, Debug)]
pub struct Elements<'a> {
    rest: usize,
    body: &'a [u8],
}

impl<'a> Iterator for Elements<'a> {
    type Item = Reply<'a>;

    fn next(&mut self) -> Option<Reply<'a>> {
        if self.rest == 0 {
            return None;
        }
        // The body was validated under the caller's limits, which are never looser than
        // these; a failure here would be a parser bug, and ending early beats panicking.
        let (reply, used) = decode(self.body, &UNBOUNDED).ok()??;
        self.rest -= 1;
        self.body = &self.body[used..];
        Some(reply)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.rest, Some(self.rest))
    }
}

const UNBOUNDED: Limits = Limits {
    max_bulk_len: usize::MAX,
    max_array_len: usize::MAX,
    max_depth: MAX_DEPTH,
    max_line_len: usize::MAX,
};

/// Why bytes from a server are not RESP2. Every variant is fatal for the connection:
/// the stream can no longer be trusted to be in step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The first byte of a reply is not one of `+ - : $ *`.
    UnknownType(u8),
    /// A `\r` not followed by `\n`.
    BadLineEnding,
    /// A line longer than [`Limits::max_line_len`].
    LineTooLong,
    /// An integer or length that is not an optional `-` and decimal digits.
    InvalidInteger,
    /// An integer or length outside `i64`.
    IntegerOverflow,
    /// A length below `-1`.
    NegativeLength,
    /// A bulk string longer than [`Limits::max_bulk_len`].
    BulkTooLong,
    /// An array longer than [`Limits::max_array_len`].
    ArrayTooLong,
    /// Arrays nested deeper than [`Limits::max_depth`].
    TooDeep,
    /// A bulk string whose payload is not followed by `\r\n`.
    BadBulkTerminator,
}

impl ProtocolError {
    fn as_str(self) -> &'static str {
        match self {
            ProtocolError::UnknownType(_) => "unknown reply type byte",
            ProtocolError::BadLineEnding => "carriage return not followed by line feed",
            ProtocolError::LineTooLong => "reply line longer than the limit",
            ProtocolError::InvalidInteger => "malformed integer",
            ProtocolError::IntegerOverflow => "integer does not fit in 64 bits",
            ProtocolError::NegativeLength => "negative length other than -1",
            ProtocolError::BulkTooLong => "bulk string longer than the limit",
            ProtocolError::ArrayTooLong => "array longer than the limit",
            ProtocolError::TooDeep => "arrays nested deeper than the limit",
            ProtocolError::BadBulkTerminator => "bulk string not terminated by CRLF",
        }
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::UnknownType(b) => write!(f, "{} (0x{b:02x})", self.as_str()),
            _ => f.write_str(self.as_str()),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// Parses one reply from the start of `buf`.
///
/// Returns `Ok(Some((reply, used)))` with the number of bytes the reply took,
/// `Ok(None)` when `buf` holds only a prefix of a reply (including an empty `buf`), and
/// `Err` when the bytes cannot be RESP2 or break a limit.
///
/// # Example
///
/// ```
/// use quorumlock::__private::resp::{decode, Limits, Reply};
///
/// let limits = Limits::default();
/// assert_eq!(decode(b":12", &limits), Ok(None)); // wait for more
/// assert_eq!(decode(b":12\r\n", &limits), Ok(Some((Reply::Integer(12), 5))));
/// ```
pub fn decode<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(Reply<'a>, usize)>, ProtocolError> {
    if let Some(common) = common_reply(buf, limits) {
        return Ok(Some(common));
    }
    decode_any(buf, limits)
}

/// Where a call to [`decode_resume`] stopped in an incomplete reply: the next call with
/// the same bytes (and more after them) resumes here instead of from the first byte.
///
/// # Invariants
///
/// - Positions are relative to the start of the reply, so the caller may move its
///   buffer (compact it) between calls, as long as the reply's bytes stay the same.
/// - `pos` is an element boundary of the outer array; `remaining[..=top]` are the
///   elements still to read there at each nesting level, as the parser left them.
/// - `clean` bytes after the type byte at `pos` are known to hold no CR or LF.
///
/// `Hash` is for the model checker's state fingerprints (`Session::fingerprint`).
#[derive(Clone, Debug, Hash)]
pub struct Progress {
    /// An array is in progress (`len`, `body_start`, `top`, `remaining` are valid).
    in_array: bool,
    len: usize,
    body_start: usize,
    pos: usize,
    top: usize,
    remaining: [usize; MAX_DEPTH],
    clean: usize,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            in_array: false,
            len: 0,
            body_start: 0,
            pos: 0,
            top: 0,
            remaining: [0; MAX_DEPTH],
            clean: 0,
        }
    }
}

impl Progress {
    /// Forgets the saved position: the next call starts at the reply's first byte. Call
    /// it whenever the bytes at the start of the buffer change other than by appending
    /// (a reply consumed, the connection dropped).
    #[inline]
    pub fn clear(&mut self) {
        self.in_array = false;
        self.pos = 0;
        self.clean = 0;
    }
}

/// [`decode`], resuming from where the previous call on the same reply stopped.
///
/// `progress` must be cleared ([`Progress::clear`]) whenever the reply at the start of
/// `buf` changes; it is cleared here when a reply completes or fails.
///
/// # Example
///
/// ```
/// use quorumlock::__private::resp::{decode, decode_resume, Limits, Progress};
///
/// let whole = b"*3\r\n:1\r\n:2\r\n:3\r\n";
/// let mut progress = Progress::default();
/// for end in 1..whole.len() {
///     assert_eq!(decode_resume(&whole[..end], &Limits::default(), &mut progress), Ok(None));
/// }
/// let done = decode_resume(whole, &Limits::default(), &mut progress);
/// assert_eq!(done, decode(whole, &Limits::default()));
/// ```
pub fn decode_resume<'a>(
    buf: &'a [u8],
    limits: &Limits,
    progress: &mut Progress,
) -> Result<Option<(Reply<'a>, usize)>, ProtocolError> {
    if progress.pos == 0 && !progress.in_array && progress.clean == 0 {
        if let Some(common) = common_reply(buf, limits) {
            return Ok(Some(common));
        }
    }
    let result = decode_from(buf, limits, progress);
    if !matches!(result, Ok(None)) {
        progress.clear();
    }
    result
}

/// The general parser, for every reply, from its first byte.
fn decode_any<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(Reply<'a>, usize)>, ProtocolError> {
    decode_from(buf, limits, &mut Progress::default())
}

/// The general parser, resuming at `p` (a fresh `Progress` starts at the first byte).
/// On `Ok(None)`, `p` holds where to resume.
fn decode_from<'a>(
    buf: &'a [u8],
    limits: &Limits,
    p: &mut Progress,
) -> Result<Option<(Reply<'a>, usize)>, ProtocolError> {
    if !p.in_array {
        let Some((head, pos)) = header(buf, 0, limits, &mut p.clean)? else {
            return Ok(None);
        };
        let len = match head {
            Header::Done(reply) => return Ok(Some((reply, pos))),
            Header::Array(None) => return Ok(Some((Reply::Array(None), pos))),
            Header::Array(Some(len)) => len,
        };
        p.in_array = true;
        p.len = len;
        p.body_start = pos;
        p.pos = pos;
        p.top = 0;
        p.remaining[0] = len;
        p.clean = 0;
    }
    let max_depth = limits.max_depth.clamp(1, MAX_DEPTH);
    // remaining[d] = elements still to read at nesting level d (0 = the outer array).
    loop {
        while p.remaining[p.top] == 0 {
            if p.top == 0 {
                let body = &buf[p.body_start..p.pos];
                let len = p.len;
                return Ok(Some((Reply::Array(Some(ArrayReply { len, body })), p.pos)));
            }
            p.top -= 1;
        }
        // An element boundary: what is saved if the element is not all there yet.
        let Some((head, next)) = header(buf, p.pos, limits, &mut p.clean)? else {
            return Ok(None);
        };
        p.remaining[p.top] -= 1;
        p.pos = next;
        p.clean = 0;
        if let Header::Array(inner) = head {
            // This array sits at depth top + 2 (the outer array is depth 1).
            if p.top + 2 > max_depth {
                return Err(ProtocolError::TooDeep);
            }
            if let Some(n @ 1..) = inner {
                p.top += 1;
                p.remaining[p.top] = n;
            }
        }
    }
}

/// The replies a lock client sees all day, recognised by their exact bytes. Gives the
/// same result as the general parser (the fuzz targets and tests check that); it only
/// skips the work of finding out.
#[inline]
fn common_reply<'a>(buf: &'a [u8], limits: &Limits) -> Option<(Reply<'a>, usize)> {
    if limits.max_line_len < 2 {
        return None;
    }
    match buf {
        [b':', d @ (b'0' | b'1'), b'\r', b'\n', ..] => {
            Some((Reply::Integer(i64::from(d - b'0')), 4))
        }
        [b'+', b'O', b'K', b'\r', b'\n', ..] => Some((Reply::Simple(&buf[1..3]), 5)),
        [b'$', b'-', b'1', b'\r', b'\n', ..] => Some((Reply::Bulk(None), 5)),
        _ => None,
    }
}

enum Header<'a> {
    /// A complete scalar reply.
    Done(Reply<'a>),
    /// An array header: its length, not yet its elements.
    Array(Option<usize>),
}

/// Reads one type byte and line at `pos`, and for bulk strings the payload too.
/// `clean` bytes after the type byte are known to hold no CR or LF (from an earlier call
/// on the same bytes); on `Ok(None)` it is updated for the next call.
fn header<'a>(
    buf: &'a [u8],
    pos: usize,
    limits: &Limits,
    clean: &mut usize,
) -> Result<Option<(Header<'a>, usize)>, ProtocolError> {
    let Some(&kind) = buf.get(pos) else {
        return Ok(None);
    };
    if !matches!(kind, b'+' | b'-' | b':' | b'$' | b'*') {
        return Err(ProtocolError::UnknownType(kind));
    }
    let Some((line, next)) = line(buf, pos + 1, limits.max_line_len, clean)? else {
        return Ok(None);
    };
    let head = match kind {
        b'+' => Header::Done(Reply::Simple(line)),
        b'-' => Header::Done(Reply::Error(line)),
        b':' => Header::Done(Reply::Integer(integer(line)?)),
        b'$' => {
            let Some(len) = length(line, limits.max_bulk_len, ProtocolError::BulkTooLong)? else {
                return Ok(Some((Header::Done(Reply::Bulk(None)), next)));
            };
            let end = next.checked_add(len).ok_or(ProtocolError::BulkTooLong)?;
            let Some(tail) = end.checked_add(2).and_then(|stop| buf.get(end..stop)) else {
                // Bytes that are present but cannot become the terminator are an error now,
                // rather than after the peer has made us wait for the rest.
                if buf.len() > end && buf[end] != b'\r' {
                    return Err(ProtocolError::BadBulkTerminator);
                }
                return Ok(None);
            };
            if tail != b"\r\n" {
                return Err(ProtocolError::BadBulkTerminator);
            }
            return Ok(Some((
                Header::Done(Reply::Bulk(Some(&buf[next..end]))),
                end + 2,
            )));
        }
        _ => Header::Array(length(
            line,
            limits.max_array_len,
            ProtocolError::ArrayTooLong,
        )?),
    };
    Ok(Some((head, next)))
}

/// The bytes from `start` up to the next CRLF, and the position after it. The first
/// `clean` bytes are known to hold no CR or LF and are not searched again; when the line
/// is incomplete, `clean` is set to how far it is known clean.
fn line<'a>(
    buf: &'a [u8],
    start: usize,
    max_len: usize,
    clean: &mut usize,
) -> Result<Option<(&'a [u8], usize)>, ProtocolError> {
    let rest = buf.get(start..).unwrap_or(&[]);
    // Look one byte past the limit so a line of exactly max_len still finds its CR.
    let window = &rest[..rest.len().min(max_len.saturating_add(1))];
    let from = (*clean).min(window.len());
    let unsearched = &window[from..];
    // A line holds neither CR nor LF before its CRLF: a lone LF is an error wherever the
    // read happens to split, so the answer never depends on how the bytes arrived.
    // Lines on the wire are a few bytes: a plain scan beats setting up a vector search.
    let found = if unsearched.len() <= 32 {
        unsearched.iter().position(|&b| b == b'\r' || b == b'\n')
    } else {
        memchr::memchr2(b'\r', b'\n', unsearched)
    };
    match found.map(|i| from + i) {
        Some(i) if rest[i] == b'\n' => Err(ProtocolError::BadLineEnding),
        Some(i) => match rest.get(i + 1) {
            None => {
                *clean = i;
                Ok(None)
            }
            Some(b'\n') => Ok(Some((&rest[..i], start + i + 2))),
            Some(_) => Err(ProtocolError::BadLineEnding),
        },
        None if window.len() > max_len => Err(ProtocolError::LineTooLong),
        None => {
            *clean = window.len();
            Ok(None)
        }
    }
}

/// A length field: `None` for `-1`, else a non-negative value within `max`.
fn length(
    line: &[u8],
    max: usize,
    too_long: ProtocolError,
) -> Result<Option<usize>, ProtocolError> {
    match integer(line)? {
        -1 => Ok(None),
        n if n < 0 => Err(ProtocolError::NegativeLength),
        n if n as u64 > max as u64 => Err(too_long),
        n => Ok(Some(n as usize)),
    }
}

fn integer(line: &[u8]) -> Result<i64, ProtocolError> {
    let (negative, digits) = match line {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, line),
    };
    if digits.is_empty() {
        return Err(ProtocolError::InvalidInteger);
    }
    let mut value: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(ProtocolError::InvalidInteger);
        }
        let digit = i64::from(d - b'0');
        // Accumulate negatively so i64::MIN parses without overflowing.
        value = value
            .checked_mul(10)
            .and_then(|v| {
                if negative {
                    v.checked_sub(digit)
                } else {
                    v.checked_add(digit)
                }
            })
            .ok_or(ProtocolError::IntegerOverflow)?;
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::Value;

    fn limits() -> Limits {
        Limits::default()
    }

    fn parse(input: &[u8]) -> Result<Option<(Value, usize)>, ProtocolError> {
        decode(input, &limits()).map(|o| o.map(|(r, n)| (Value::from_reply(&r), n)))
    }

    fn bulk(b: &[u8]) -> Value {
        Value::Bulk(Some(b.to_vec()))
    }

    /// Every reply type, as wire bytes and the value they mean.
    fn cases() -> Vec<(&'static [u8], Value)> {
        vec![
            (b"+OK\r\n", Value::Simple(b"OK".to_vec())),
            (b"+\r\n", Value::Simple(Vec::new())),
            (
                b"-NOSCRIPT No matching script\r\n",
                Value::Error(b"NOSCRIPT No matching script".to_vec()),
            ),
            (b":0\r\n", Value::Integer(0)),
            (b":-42\r\n", Value::Integer(-42)),
            (b":9223372036854775807\r\n", Value::Integer(i64::MAX)),
            (b":-9223372036854775808\r\n", Value::Integer(i64::MIN)),
            (b"$3\r\nfoo\r\n", bulk(b"foo")),
            (b"$0\r\n\r\n", bulk(b"")),
            (b"$4\r\n\r\n\0\xff\r\n", bulk(b"\r\n\0\xff")),
            (b"$-1\r\n", Value::Bulk(None)),
            (b"*-1\r\n", Value::Array(None)),
            (b"*0\r\n", Value::Array(Some(vec![]))),
            (
                b"*2\r\n:1\r\n$-1\r\n",
                Value::Array(Some(vec![Value::Integer(1), Value::Bulk(None)])),
            ),
            (
                b"*3\r\n*1\r\n+a\r\n*0\r\n*2\r\n$1\r\nb\r\n*-1\r\n",
                Value::Array(Some(vec![
                    Value::Array(Some(vec![Value::Simple(b"a".to_vec())])),
                    Value::Array(Some(vec![])),
                    Value::Array(Some(vec![bulk(b"b"), Value::Array(None)])),
                ])),
            ),
        ]
    }

    #[test]
    fn every_reply_type_parses_whole_and_reencodes() {
        for (wire, want) in cases() {
            assert_eq!(
                parse(wire),
                Ok(Some((want.clone(), wire.len()))),
                "{wire:?}"
            );
            let mut out = Vec::new();
            want.encode(&mut out);
            assert_eq!(out, wire);
        }
    }

    #[test]
    fn every_strict_prefix_is_incomplete() {
        for (wire, _) in cases() {
            for cut in 0..wire.len() {
                assert_eq!(
                    parse(&wire[..cut]),
                    Ok(None),
                    "{:?} cut at {cut}",
                    &wire[..cut]
                );
            }
        }
    }

    #[test]
    fn trailing_bytes_are_left_for_the_next_reply() {
        for (wire, want) in cases() {
            let mut padded = wire.to_vec();
            padded.extend_from_slice(b"+NEXT\r\n");
            assert_eq!(parse(&padded), Ok(Some((want, wire.len()))));
        }
    }

    #[test]
    fn a_pipelined_stream_parses_the_same_at_every_split() {
        let mut stream = Vec::new();
        let mut want = Vec::new();
        for (wire, value) in cases() {
            stream.extend_from_slice(wire);
            want.push(value);
        }
        for split in 0..=stream.len() {
            // Feed the first `split` bytes, then the rest, the way a socket would.
            let mut buf = stream[..split].to_vec();
            let mut got = Vec::new();
            let mut fed = split;
            loop {
                match decode(&buf, &limits()).unwrap() {
                    Some((r, n)) => {
                        got.push(Value::from_reply(&r));
                        buf.drain(..n);
                    }
                    None if fed < stream.len() => {
                        buf.extend_from_slice(&stream[fed..]);
                        fed = stream.len();
                    }
                    None => break,
                }
            }
            assert_eq!(got, want, "split at {split}");
        }
    }

    #[test]
    fn malformed_input_is_a_typed_error() {
        let bad: &[(&[u8], ProtocolError)] = &[
            (b"?x\r\n", ProtocolError::UnknownType(b'?')),
            (b"+OK\rX", ProtocolError::BadLineEnding),
            (b"+OK\n", ProtocolError::BadLineEnding),
            // Found by the fuzzer: a lone LF used to be accepted whole but refused when
            // the read split right after it.
            (b"+\n\r\n", ProtocolError::BadLineEnding),
            (b"+\n\r", ProtocolError::BadLineEnding),
            (b"+\n", ProtocolError::BadLineEnding),
            (b"-a\nb\r\n", ProtocolError::BadLineEnding),
            (b":\r\n", ProtocolError::InvalidInteger),
            (b":-\r\n", ProtocolError::InvalidInteger),
            (b":+1\r\n", ProtocolError::InvalidInteger),
            (b":1a\r\n", ProtocolError::InvalidInteger),
            (b":9223372036854775808\r\n", ProtocolError::IntegerOverflow),
            (b":-9223372036854775809\r\n", ProtocolError::IntegerOverflow),
            (b"$-2\r\n", ProtocolError::NegativeLength),
            (b"*-5\r\n", ProtocolError::NegativeLength),
            (b"$4611686018427387904\r\n", ProtocolError::BulkTooLong),
            (b"$99999999999999999999\r\n", ProtocolError::IntegerOverflow),
            (b"*4611686018427387904\r\n", ProtocolError::ArrayTooLong),
            (b"$3\r\nfooXY", ProtocolError::BadBulkTerminator),
            (b"$3\r\nfooX", ProtocolError::BadBulkTerminator),
            (b"*2\r\n:1\r\n!", ProtocolError::UnknownType(b'!')),
        ];
        for (input, err) in bad {
            assert_eq!(parse(input), Err(*err), "{input:?}");
        }
    }

    #[test]
    fn limits_hold_at_the_boundary() {
        let l = Limits {
            max_bulk_len: 3,
            max_array_len: 2,
            max_depth: 3,
            max_line_len: 4,
        };
        assert!(decode(b"$3\r\nabc\r\n", &l).unwrap().is_some());
        assert_eq!(decode(b"$4\r\n", &l), Err(ProtocolError::BulkTooLong));
        assert!(decode(b"*2\r\n:1\r\n:2\r\n", &l).unwrap().is_some());
        assert_eq!(decode(b"*3\r\n", &l), Err(ProtocolError::ArrayTooLong));
        assert!(decode(b"*1\r\n*1\r\n*0\r\n", &l).unwrap().is_some());
        assert_eq!(
            decode(b"*1\r\n*1\r\n*1\r\n*0\r\n", &l),
            Err(ProtocolError::TooDeep)
        );
        assert_eq!(
            decode(b"*1\r\n*1\r\n*1\r\n*-1\r\n", &l),
            Err(ProtocolError::TooDeep)
        );
        assert!(decode(b"+abcd\r\n", &l).unwrap().is_some());
        assert_eq!(decode(b"+abcde\r\n", &l), Err(ProtocolError::LineTooLong));
        assert_eq!(decode(b"+abcde", &l), Err(ProtocolError::LineTooLong));
        assert_eq!(decode(b"+abcd", &l), Ok(None));
    }

    #[test]
    fn the_common_replies_shortcut_agrees_with_the_general_parser() {
        let inputs: [&[u8]; 10] = [
            b":0\r\n",
            b":1\r\n",
            b"+OK\r\n",
            b"$-1\r\n",
            b":1\r\n:0\r\n",
            b"+OK\r\n+OK\r\n",
            b":10\r\n",
            b"+OKAY\r\n",
            b"$-10\r\n",
            b":1\rX",
        ];
        for input in inputs {
            assert_eq!(
                decode(input, &limits()),
                decode_any(input, &limits()),
                "{input:?}"
            );
        }
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        let mut deep = Vec::new();
        for _ in 0..50_000 {
            deep.extend_from_slice(b"*1\r\n");
        }
        assert_eq!(parse(&deep), Err(ProtocolError::TooDeep));
        let generous = Limits {
            max_depth: usize::MAX,
            ..limits()
        };
        assert_eq!(decode(&deep, &generous), Err(ProtocolError::TooDeep));
    }

    #[test]
    fn array_elements_iterate_in_place() {
        let wire = b"*3\r\n:1\r\n$2\r\nab\r\n*1\r\n+x\r\n";
        let (reply, _) = decode(wire, &limits()).unwrap().unwrap();
        let Reply::Array(Some(arr)) = reply else {
            panic!("not an array")
        };
        assert_eq!(arr.len(), 3);
        let items: Vec<_> = arr.iter().collect();
        assert_eq!(items[0], Reply::Integer(1));
        assert_eq!(items[1], Reply::Bulk(Some(b"ab")));
        let Reply::Array(Some(inner)) = items[2] else {
            panic!("not an array")
        };
        assert_eq!(inner.iter().next(), Some(Reply::Simple(b"x")));
    }

    /// Feeds `input` to `decode_resume` in the given chunk sizes, checking after every
    /// chunk that it answers exactly as `decode` on the same bytes from the start.
    fn resume_agrees(input: &[u8], chunks: &mut dyn FnMut() -> usize, l: &Limits) {
        let mut progress = Progress::default();
        let mut start = 0; // where the current reply begins
        let mut end = 0;
        while end < input.len() {
            end = (end + chunks()).min(input.len());
            loop {
                let buf = &input[start..end];
                let fresh = decode(buf, l);
                let resumed = decode_resume(buf, l, &mut progress);
                assert_eq!(
                    resumed,
                    fresh,
                    "{:?} at {start}..{end}",
                    input.escape_ascii()
                );
                match fresh {
                    Ok(Some((_, used))) => start += used,
                    Ok(None) => break,
                    Err(_) => return,
                }
            }
        }
    }

    #[test]
    fn resuming_answers_as_parsing_from_the_start_at_every_split() {
        let mut rng = fastrand::Rng::with_seed(11);
        let mut inputs: Vec<Vec<u8>> = cases().into_iter().map(|(b, _)| b.to_vec()).collect();
        inputs.push(
            cases()
                .iter()
                .flat_map(|(b, _)| b.iter().copied())
                .collect(),
        );
        // Corrupted copies: errors must come at the same point either way.
        for _ in 0..300 {
            let mut v = inputs[rng.usize(..inputs.len())].clone();
            let i = rng.usize(..v.len());
            v[i] = *rng.choice(b"\r\n*$:+-01x".iter()).unwrap();
            inputs.push(v);
        }
        let tight = Limits {
            max_line_len: 8,
            max_bulk_len: 8,
            max_array_len: 3,
            max_depth: 2,
        };
        for input in &inputs {
            for l in [limits(), tight] {
                resume_agrees(input, &mut || 1, &l);
                resume_agrees(input, &mut || rng.usize(1..6), &l);
            }
        }
    }

    #[test]
    fn a_trickled_reply_is_not_reread_from_its_start() {
        // 65,536 elements, then a 60 KiB line: fed one byte at a time. Reparsing from the
        // start at every byte would be ~10^10 steps; resuming is linear.
        let mut array = b"*65536\r\n".to_vec();
        for _ in 0..65_536 {
            array.extend_from_slice(b":1\r\n");
        }
        let mut line = b"+".to_vec();
        line.resize(60 * 1024, b'a');
        line.extend_from_slice(b"\r\n");
        for input in [array, line] {
            let mut progress = Progress::default();
            let started = std::time::Instant::now();
            for end in 1..input.len() {
                assert_eq!(
                    decode_resume(&input[..end], &limits(), &mut progress),
                    Ok(None)
                );
            }
            let done = decode_resume(&input, &limits(), &mut progress)
                .unwrap()
                .unwrap();
            assert_eq!(done.1, input.len());
            // Generous: linear work is milliseconds even unoptimized on a loaded machine;
            // quadratic is minutes.
            assert!(started.elapsed() < std::time::Duration::from_secs(20));
        }
    }
}
