//! Commands as RESP2 arrays of bulk strings, appended to a caller-owned buffer.
//!
//! Nothing here allocates beyond growing the caller's buffer: integers are formatted on
//! the stack. A buffer that is cleared and reused reaches a steady size and stays there.
//!
//! # Example
//!
//! ```
//! use quorumlock::__private::resp::encode::{array, bulk, bulk_int};
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

/// Formats `value` into the tail of `buf` and returns the digits, two at a time.
pub(crate) fn decimal(buf: &mut [u8; 20], mut value: u64) -> &[u8] {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
                                2021222324252627282930313233343536373839\
                                4041424344454647484950515253545556575859\
                                6061626364656667686970717273747576777879\
                                8081828384858687888990919293949596979899";
    let mut i = buf.len();
    while value >= 100 {
        let pair = (value % 100) as usize * 2;
        value /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if value >= 10 {
        let pair = value as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + value as u8;
    }
    &buf[i..]
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
    fn decimal_matches_std_formatting() {
        let mut values: Vec<u64> = (0..10_000).collect();
        values.extend([
            u64::MAX,
            u64::MAX - 1,
            99_999,
            100_000,
            1 << 40,
            10u64.pow(19),
        ]);
        for v in values {
            let mut buf = [0u8; 20];
            assert_eq!(decimal(&mut buf, v), v.to_string().as_bytes());
        }
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
