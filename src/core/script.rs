//! The Lua scripts that make release and extend safe (they act only on a key whose value
//! is the caller's token, atomically on the server), and those of multi-resource locks
//! and fencing (all keys or none; a fence counter only ever rises).
//!
//! The SHA1 digests are fixed constants (the crate takes no hashing dependency); the
//! live-server tests check them against `SCRIPT LOAD`, and the unit test below checks them
//! against an independent SHA1.
//!
//! # Release notices
//!
//! Every script that deletes a lock key ([`RELEASE`], [`RELEASE_ALL`],
//! [`RELEASE_FENCED`]) publishes, for each key it actually deletes and only then, an empty
//! message on the channel [`RELEASED_PREFIX`] + key, after the delete in the same script
//! (so a subscriber that hears it and tries at once finds the key free on that node). A
//! key not deleted (someone else's token, already gone) publishes nothing. The payload is
//! empty on purpose: the token is a credential, and a multi-key or partial release can
//! leave the same token live on other nodes, so it is never broadcast to whoever may
//! subscribe. The return values are those of the scripts without the notice. The
//! notice is sent with `redis.pcall`: a user whose ACL allows no channel (Redis 7's
//! default `acl-pubsub-default resetchannels`), or a server with PUBLISH renamed, still
//! releases; its waiters only hear nothing and poll.
//! `crate::core::notice` is the subscriber's side.

/// Deletes `KEYS[1]` only if its value is `ARGV[1]`, and then publishes the release
/// notice for it (see [`RELEASED_PREFIX`]). Returns 1 if deleted, else 0.
pub const RELEASE: &[u8] = br#"if redis.call("get",KEYS[1]) == ARGV[1] then local d=redis.call("del",KEYS[1]) redis.pcall("publish","quorumlock:released:"..KEYS[1],"") return d else return 0 end"#;

/// The channel of a resource's release notice is this prefix, then the resource (the key)
/// itself; the scripts spell it out in their Lua (a unit test checks they agree).
pub const RELEASED_PREFIX: &[u8] = b"quorumlock:released:";

/// SHA1 of [`RELEASE`], for `EVALSHA`.
pub const RELEASE_SHA: &[u8; 40] = b"a652bac8186acb87b0d503b386411ad496bf6599";

/// Sets the expiry of `KEYS[1]` to `ARGV[2]` ms only if its value is `ARGV[1]`.
/// Returns 1 if extended, else 0.
pub const EXTEND: &[u8] = br#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("pexpire",KEYS[1],ARGV[2]) else return 0 end"#;

/// SHA1 of [`EXTEND`], for `EVALSHA`.
pub const EXTEND_SHA: &[u8; 40] = b"36e94d1c6e02fcefaa7ee5d79eee614dbac55f10";

/// Takes every one of `ARGV[3]` keys (`KEYS[1..n]`) with value `ARGV[1]` and expiry
/// `ARGV[2]` ms, or none if any exists: `lock_all`'s one command per node, and the fenced
/// acquire. Answers as `SET NX` does (`+OK`, or nil when any key is taken); with fence
/// counter keys after the lock keys (`KEYS[n+1..]`), answers the largest counter among
/// them (0 for none) instead of `+OK`.
pub const ACQUIRE: &[u8] = br#"local n=tonumber(ARGV[3]) for i=1,n do if redis.call("exists",KEYS[i])==1 then return false end end for i=1,n do redis.call("set",KEYS[i],ARGV[1],"px",ARGV[2]) end if #KEYS==n then return redis.status_reply("OK") end local m=0 for i=n+1,#KEYS do local c=tonumber(redis.call("get",KEYS[i])) if c and c>m then m=c end end return m"#;

/// SHA1 of [`ACQUIRE`].
pub const ACQUIRE_SHA: &[u8; 40] = b"d6cccac015aba2c5360e6a0e8c7916707871bd3f";

/// The write-back of a fence: with `n = #KEYS / 2` lock keys (`KEYS[1..n]`) then their
/// fence counters (`KEYS[n+1..]`), raises every counter to `ARGV[2]` where it is lower (or
/// missing), then answers 1 if every lock key still holds the token `ARGV[1]`, else 0. The
/// raise goes everywhere (more copies of the counter survive a restart), but a node
/// confirms the fence only while it holds the lock: the next holder, which needs the key
/// free there, can only read that counter after the raise (the proof is in
/// `src/fencing.rs`).
pub const FENCE: &[u8] = br#"local n=#KEYS/2 local f=tonumber(ARGV[2]) for i=1,n do local c=tonumber(redis.call("get",KEYS[n+i])) if not c or c<f then redis.call("set",KEYS[n+i],ARGV[2]) end end for i=1,n do if redis.call("get",KEYS[i])~=ARGV[1] then return 0 end end return 1"#;

/// SHA1 of [`FENCE`].
pub const FENCE_SHA: &[u8; 40] = b"e109732706c38e2cb64e03e8892e7e7537148373";

/// Deletes each of `KEYS` whose value is `ARGV[1]`, publishing the release notice of each
/// it deletes. Returns 1 if all were, else 0.
pub const RELEASE_ALL: &[u8] = br#"local n=0 for i=1,#KEYS do if redis.call("get",KEYS[i])==ARGV[1] then redis.call("del",KEYS[i]) redis.pcall("publish","quorumlock:released:"..KEYS[i],"") n=n+1 end end if n==#KEYS then return 1 end return 0"#;

/// SHA1 of [`RELEASE_ALL`].
pub const RELEASE_ALL_SHA: &[u8; 40] = b"1a7091526b37e6b3c1a477f60380bef03fdf586d";

/// Sets the expiry of every one of `KEYS` to `ARGV[2]` ms if all their values are
/// `ARGV[1]`, else touches none. Returns 1 if extended, else 0.
pub const EXTEND_ALL: &[u8] = br#"for i=1,#KEYS do if redis.call("get",KEYS[i])~=ARGV[1] then return 0 end end for i=1,#KEYS do redis.call("pexpire",KEYS[i],ARGV[2]) end return 1"#;

/// SHA1 of [`EXTEND_ALL`].
pub const EXTEND_ALL_SHA: &[u8; 40] = b"625585dd655db49164a0d3f383c152341a6e2375";

/// A fenced lock's release: for each of the `n = #KEYS / 2` lock keys (`KEYS[1..n]`) whose
/// value is `ARGV[1]`, raises its fence counter (`KEYS[n + i]`) to `ARGV[2]` where lower,
/// then deletes the key and publishes its release notice. Returns 1 if every key was
/// ours, else 0. A key is never freed
/// on a node without its holder's fence there: the next holder's acquire, which needs the
/// key free, reads it.
pub const RELEASE_FENCED: &[u8] = br#"local n=#KEYS/2 local f=tonumber(ARGV[2]) local d=0 for i=1,n do if redis.call("get",KEYS[i])==ARGV[1] then local c=tonumber(redis.call("get",KEYS[n+i])) if not c or c<f then redis.call("set",KEYS[n+i],ARGV[2]) end redis.call("del",KEYS[i]) redis.pcall("publish","quorumlock:released:"..KEYS[i],"") d=d+1 end end if d==n then return 1 end return 0"#;

/// SHA1 of [`RELEASE_FENCED`].
pub const RELEASE_FENCED_SHA: &[u8; 40] = b"bf583422ed16115355bfc3c90e718e15afe4a835";

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain SHA1 (FIPS 180-4), here only to check the constants above.
    fn sha1_hex(data: &[u8]) -> String {
        let mut h: [u32; 5] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0];
        let mut msg = data.to_vec();
        msg.push(0x80);
        while msg.len() % 64 != 56 {
            msg.push(0);
        }
        msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
        for block in msg.chunks(64) {
            let mut w = [0u32; 80];
            for i in 0..16 {
                w[i] = u32::from_be_bytes([
                    block[4 * i],
                    block[4 * i + 1],
                    block[4 * i + 2],
                    block[4 * i + 3],
                ]);
            }
            for i in 16..80 {
                w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
            }
            let [mut a, mut b, mut c, mut d, mut e] = h;
            for (i, wi) in w.iter().enumerate() {
                let (f, k) = match i {
                    0..=19 => ((b & c) | (!b & d), 0x5A827999),
                    20..=39 => (b ^ c ^ d, 0x6ED9EBA1),
                    40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1BBCDC),
                    _ => (b ^ c ^ d, 0xCA62C1D6),
                };
                let t = a
                    .rotate_left(5)
                    .wrapping_add(f)
                    .wrapping_add(e)
                    .wrapping_add(k)
                    .wrapping_add(*wi);
                e = d;
                d = c;
                c = b.rotate_left(30);
                b = a;
                a = t;
            }
            for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
                *x = x.wrapping_add(y);
            }
        }
        h.iter().map(|x| format!("{x:08x}")).collect()
    }

    #[test]
    fn digests_match_the_scripts() {
        assert_eq!(sha1_hex(b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(sha1_hex(RELEASE).as_bytes(), RELEASE_SHA);
        assert_eq!(sha1_hex(EXTEND).as_bytes(), EXTEND_SHA);
        assert_eq!(sha1_hex(ACQUIRE).as_bytes(), ACQUIRE_SHA);
        assert_eq!(sha1_hex(FENCE).as_bytes(), FENCE_SHA);
        assert_eq!(sha1_hex(RELEASE_ALL).as_bytes(), RELEASE_ALL_SHA);
        assert_eq!(sha1_hex(EXTEND_ALL).as_bytes(), EXTEND_ALL_SHA);
        assert_eq!(sha1_hex(RELEASE_FENCED).as_bytes(), RELEASE_FENCED_SHA);
    }

    fn count(hay: &[u8], needle: &[u8]) -> usize {
        hay.windows(needle.len()).filter(|w| *w == needle).count()
    }

    #[test]
    fn every_delete_publishes_on_the_released_channel() {
        let channel = [&b"\""[..], RELEASED_PREFIX, b"\"..KEYS["].concat();
        for script in [RELEASE, RELEASE_ALL, RELEASE_FENCED] {
            let dels = count(script, b"redis.call(\"del\"");
            assert_eq!(dels, 1);
            assert_eq!(count(script, b"redis.pcall(\"publish\""), dels);
            assert_eq!(count(script, &channel), dels);
            // The empty payload: the token is never broadcast.
            assert_eq!(count(script, b"],\"\")"), dels);
            assert_eq!(count(script, b"ARGV[1])"), 0);
        }
        for script in [EXTEND, ACQUIRE, FENCE, EXTEND_ALL] {
            assert_eq!(count(script, b"publish"), 0);
        }
    }
}
