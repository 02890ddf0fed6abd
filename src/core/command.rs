//! The three commands of the lock, encoded straight into the driver's reused buffer.

use super::script;
use super::token::Token;
use crate::resp::encode::{array, bulk, bulk_int};
use bytes::BufMut;

/// `SET key token NX PX ttl_ms`.
pub fn acquire<B: BufMut>(out: &mut B, key: &[u8], token: &Token, ttl_ms: i64) {
    array(out, 6);
    bulk(out, b"SET");
    bulk(out, key);
    bulk(out, token.as_bytes());
    bulk(out, b"NX");
    bulk(out, b"PX");
    bulk_int(out, ttl_ms);
}

/// Compare-and-delete: `EVALSHA sha 1 key token`, or `EVAL script 1 key token` when
/// `by_sha` is false (after `NOSCRIPT`, or when no reply will be read).
pub fn release<B: BufMut>(out: &mut B, key: &[u8], token: &Token, by_sha: bool) {
    array(out, 5);
    script_head(out, by_sha, script::RELEASE, script::RELEASE_SHA);
    bulk(out, key);
    bulk(out, token.as_bytes());
}

/// Compare-and-pexpire: `EVALSHA sha 1 key token ttl_ms` (or `EVAL` as for release).
pub fn extend<B: BufMut>(out: &mut B, key: &[u8], token: &Token, ttl_ms: i64, by_sha: bool) {
    array(out, 6);
    script_head(out, by_sha, script::EXTEND, script::EXTEND_SHA);
    bulk(out, key);
    bulk(out, token.as_bytes());
    bulk_int(out, ttl_ms);
}

fn script_head<B: BufMut>(out: &mut B, by_sha: bool, body: &[u8], sha: &[u8]) {
    if by_sha {
        bulk(out, b"EVALSHA");
        bulk(out, sha);
    } else {
        bulk(out, b"EVAL");
        bulk(out, body);
    }
    bulk(out, b"1");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_by_sha_is_byte_exact() {
        let mut out = Vec::new();
        release(&mut out, b"k", &Token::from_bits(0), true);
        let want = format!(
            "*5\r\n$7\r\nEVALSHA\r\n$40\r\n{}\r\n$1\r\n1\r\n$1\r\nk\r\n$32\r\n{}\r\n",
            std::str::from_utf8(script::RELEASE_SHA).unwrap(),
            "0".repeat(32)
        );
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }
}
