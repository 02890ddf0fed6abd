//! The three commands of the lock, encoded straight into the driver's reused buffer.

use super::script;
use super::token::Token;
use crate::resp::encode::{bulk, bulk_int, line};
use bytes::BufMut;

// The fixed parts of each command are written as whole byte strings: this is the hot
// path, and one copy beats six length headers formatted one by one. The tests check the
// result against the generic encoder.

/// `SET key token NX PX ttl_ms`.
pub fn acquire<B: BufMut>(out: &mut B, key: &[u8], token: &Token, ttl_ms: i64) {
    out.put_slice(b"*6\r\n$3\r\nSET\r\n");
    bulk(out, key);
    token_arg(out, token);
    out.put_slice(b"$2\r\nNX\r\n$2\r\nPX\r\n");
    bulk_int(out, ttl_ms);
}

/// Compare-and-delete: `EVALSHA sha 1 key token`, or `EVAL script 1 key token` when
/// `by_sha` is false (after `NOSCRIPT`, or when no reply will be read).
pub fn release<B: BufMut>(out: &mut B, key: &[u8], token: &Token, by_sha: bool) {
    out.put_slice(b"*5\r\n");
    script_head(out, by_sha, script::RELEASE, script::RELEASE_SHA);
    bulk(out, key);
    token_arg(out, token);
}

/// Compare-and-pexpire: `EVALSHA sha 1 key token ttl_ms` (or `EVAL` as for release).
pub fn extend<B: BufMut>(out: &mut B, key: &[u8], token: &Token, ttl_ms: i64, by_sha: bool) {
    out.put_slice(b"*6\r\n");
    script_head(out, by_sha, script::EXTEND, script::EXTEND_SHA);
    bulk(out, key);
    token_arg(out, token);
    bulk_int(out, ttl_ms);
}

/// Rewrites one `EVALSHA` command as encoded by [`release`] or [`extend`] into the same
/// command with `EVAL` and the script itself, for a node that answered `NOSCRIPT`.
/// Returns `false` (and writes nothing) for bytes that are not such a command.
pub fn evalsha_to_eval<B: BufMut>(out: &mut B, cmd: &[u8]) -> bool {
    const HEAD: usize = 4; // "*5\r\n" or "*6\r\n"
    const NAME: &[u8] = b"$7\r\nEVALSHA\r\n$40\r\n";
    let sha_at = HEAD + NAME.len();
    let rest_at = sha_at + 40 + 2;
    if cmd.len() < rest_at || cmd.get(HEAD..sha_at) != Some(NAME) {
        return false;
    }
    let script = match &cmd[sha_at..sha_at + 40] {
        sha if sha == script::RELEASE_SHA => script::RELEASE,
        sha if sha == script::EXTEND_SHA => script::EXTEND,
        _ => return false,
    };
    out.put_slice(&cmd[..HEAD]);
    out.put_slice(b"$4\r\nEVAL\r\n");
    line(out, b'$', script.len() as u64, false);
    out.put_slice(script);
    out.put_slice(b"\r\n");
    out.put_slice(&cmd[rest_at..]);
    true
}

fn token_arg<B: BufMut>(out: &mut B, token: &Token) {
    const _: () = assert!(std::mem::size_of::<Token>() == 32);
    out.put_slice(b"$32\r\n");
    out.put_slice(token.as_bytes());
    out.put_slice(b"\r\n");
}

fn script_head<B: BufMut>(out: &mut B, by_sha: bool, body: &[u8], sha: &[u8]) {
    if by_sha {
        out.put_slice(b"$7\r\nEVALSHA\r\n$40\r\n");
        out.put_slice(sha);
    } else {
        out.put_slice(b"$4\r\nEVAL\r\n");
        line(out, b'$', body.len() as u64, false);
        out.put_slice(body);
    }
    out.put_slice(b"\r\n$1\r\n1\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::encode::command;

    #[test]
    fn commands_match_the_generic_encoder() {
        let token = Token::from_bits(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let t = token.as_bytes();
        for key in [&b"k"[..], b"", b"a\r\nb", &[0xff; 100]] {
            for (by_sha, name, rel, ext) in [
                (
                    true,
                    &b"EVALSHA"[..],
                    script::RELEASE_SHA,
                    script::EXTEND_SHA,
                ),
                (false, b"EVAL", script::RELEASE, script::EXTEND),
            ] {
                let (mut got, mut want) = (Vec::new(), Vec::new());
                release(&mut got, key, &token, by_sha);
                command(&mut want, &[name, rel, b"1", key, t]);
                assert_eq!(got, want);
                let (mut got, mut want) = (Vec::new(), Vec::new());
                extend(&mut got, key, &token, 1234, by_sha);
                command(&mut want, &[name, ext, b"1", key, t, b"1234"]);
                assert_eq!(got, want);
            }
            for by_sha_cmd in [0, 1] {
                let (mut sha, mut eval, mut rewritten) = (Vec::new(), Vec::new(), Vec::new());
                if by_sha_cmd == 0 {
                    release(&mut sha, key, &token, true);
                    release(&mut eval, key, &token, false);
                } else {
                    extend(&mut sha, key, &token, 77, true);
                    extend(&mut eval, key, &token, 77, false);
                }
                assert!(evalsha_to_eval(&mut rewritten, &sha));
                assert_eq!(rewritten, eval);
                assert!(
                    !evalsha_to_eval(&mut rewritten, &eval),
                    "EVAL is not rewritten"
                );
            }
            let (mut got, mut want) = (Vec::new(), Vec::new());
            acquire(&mut got, key, &token, 30_000);
            command(&mut want, &[b"SET", key, t, b"NX", b"PX", b"30000"]);
            assert_eq!(got, want);
        }
    }
}
