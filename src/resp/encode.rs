//! Commands as RESP2 arrays of bulk strings, appended to a caller-owned buffer.
//!
//! Nothing here allocates beyond growing the caller's buffer: integers are formatted on
//! the stack. A buffer that is cleared and reused reaches a steady size and stays there.
//!
//! # Example
//!
//! ```
//! use quorumlock::resp::encode::{array, bulk, bulk_int};
//!
//! let mut out = Vec::new();
//! array(&mut out, 3);
//! bulk(&mut out, b"PEXPIRE");
//! bulk(&mut out, b"key");
//! bulk_int(&mut out, 30_000);
//! assert_eq!(out, b"*3\r\n$7\r\nPEXPIRE\r\n$3\r\nkey\r\n$5\r\n30000\r\n");
//! ```

use bytes::BufMut;

/// Appends an array header for `len` elements.
pub fn array<B: BufMut>(out: &mut B, len: usize) {
    line(out, b'*', len as u64, false);
}

/// Appends one bulk string.
pub fn bulk<B: BufMut>(out: &mut B, data: &[u8]) {
    line(out, b'$', data.len() as u64, false);
    out.put_slice(data);
    out.put_slice(b"\r\n");
}

/// Appends an integer as a bulk string of its decimal digits, the way Redis expects
/// numeric arguments.
pub fn bulk_int<B: BufMut>(out: &mut B, value: i64) {
    let mut digits = [0u8; 20];
    let text = decimal(&mut digits, value.unsigned_abs());
    let negative = value < 0;
    line(
        out,
        b'$',
        (text.len() + usize::from(negative)) as u64,
        false,
    );
    if negative {
        out.put_u8(b'-');
    }
    out.put_slice(text);
    out.put_slice(b"\r\n");
}

/// Appends a whole command whose arguments are all byte strings.
pub fn command<B: BufMut>(out: &mut B, args: &[&[u8]]) {
    array(out, args.len());
    for arg in args {
        bulk(out, arg);
    }
}

/// Appends a length or integer line, `<kind>[-]<value>\r\n`, e.g. `$12\r\n` or `:-3\r\n`.
pub fn line<B: BufMut>(out: &mut B, kind: u8, value: u64, negative: bool) {
    let mut digits = [0u8; 20];
    let text = decimal(&mut digits, value);
    out.put_u8(kind);
    if negative {
        out.put_u8(b'-');
    }
    out.put_slice(text);
    out.put_slice(b"\r\n");
}

/// Formats `value` into the tail of `buf` and returns the digits.
fn decimal(buf: &mut [u8; 20], mut value: u64) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &buf[i..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_nx_px_is_byte_exact() {
        let mut out = Vec::new();
        array(&mut out, 6);
        for arg in [&b"SET"[..], b"k\r\n", b"tok", b"NX", b"PX"] {
            bulk(&mut out, arg);
        }
        bulk_int(&mut out, 10_000);
        assert_eq!(
            out,
            b"*6\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$3\r\ntok\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n10000\r\n"
        );
    }

    #[test]
    fn integers_format_at_the_edges() {
        for (v, s) in [
            (0i64, "0"),
            (7, "7"),
            (-1, "-1"),
            (i64::MAX, "9223372036854775807"),
            (i64::MIN, "-9223372036854775808"),
        ] {
            let mut out = Vec::new();
            bulk_int(&mut out, v);
            assert_eq!(out, format!("${}\r\n{}\r\n", s.len(), s).into_bytes());
        }
    }
}
