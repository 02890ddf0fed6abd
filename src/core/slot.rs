//! Redis Cluster hash slots, and the names that keep a lock's keys in one slot.
//!
//! A script may only touch keys of one hash slot on a cluster-mode node (and on the
//! proxies in front of clusters): the others answer `CROSSSLOT`. A fenced lock's script
//! names the lock key and its fence counter; `lock_all`'s names every resource and, fenced,
//! their counters. So a counter is named to hash to its resource's slot, and `lock_all`
//! over resources of different slots is refused where a node is in cluster mode.
//!
//! # The slot of a key
//!
//! CRC16 (XMODEM: polynomial 0x1021, initial 0, not reflected) of the key, modulo 16384;
//! where the key holds a hash tag, of the tag alone. The tag is what stands between the
//! first `{` and the first `}` after it, when that is not empty.
//!
//! # The counter's name
//!
//! [`FENCE_PREFIX`] + a part chosen so that the whole hashes like the resource:
//!
//! - the resource has a tag: the resource itself (the prefix holds no brace, so the
//!   counter's first tag is the resource's);
//! - the resource holds no `}`: `{resource}` (its tag is then the whole resource, which is
//!   what the resource, having no tag, hashes as);
//! - otherwise (a `}` but no tag, as in `a}b` or `x{}y`): `{n}resource`, with `n` the
//!   first decimal number whose CRC16 falls in the resource's slot. Rare names; the
//!   search costs up to a few hundred thousand CRCs of a few bytes.
//!
//! The resource is always part of its counter's name, after a tag that is a function of
//! it, so distinct resources have distinct counters but for pairs such as `orders` and
//! `{orders}`, which share one. That is harmless: a counter is a max-register that
//! acquires read and write-backs raise, so a shared one still rises for each resource's
//! holders in turn; their fences just skip more numbers.
//!
//! [`FENCE_PREFIX`]: super::command::FENCE_PREFIX

use super::command::FENCE_PREFIX;

/// Hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16/XMODEM of `data`.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::slot::crc16;
///
/// assert_eq!(crc16(b"123456789"), 0x31c3);
/// ```
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash tag of `key`: what stands between its first `{` and the first `}` after it,
/// when that is not empty.
pub fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = memchr::memchr(b'{', key)?;
    let len = memchr::memchr(b'}', &key[open + 1..])?;
    (len != 0).then(|| &key[open + 1..open + 1 + len])
}

/// The cluster hash slot of `key`.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::slot::slot;
///
/// assert_eq!(slot(b"foo"), 12182);
/// assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
/// ```
pub fn slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// The first decimal number whose text hashes to `slot` (below [`SLOTS`]): a tag that
/// puts a key in that slot.
fn tag_for(slot: u16) -> u64 {
    let mut digits = [0u8; 20];
    (0..)
        .find(|&n: &u64| crc16(decimal(n, &mut digits)) % SLOTS == slot)
        .unwrap_or(0)
}

/// `n` in decimal, written at the end of `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// How the fence counter of a resource is named (see the module docs), so that an
/// encoder can write it without building it first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceName {
    /// [`FENCE_PREFIX`] + resource: the resource has a hash tag.
    Plain,
    /// [`FENCE_PREFIX`] + `{` + resource + `}`.
    Braced,
    /// [`FENCE_PREFIX`] + `{n}` + resource, `n` in decimal.
    Tagged(u64),
}

impl FenceName {
    /// The name of `resource`'s counter.
    pub fn of(resource: &[u8]) -> FenceName {
        if hash_tag(resource).is_some() {
            FenceName::Plain
        } else if memchr::memchr(b'}', resource).is_none() {
            FenceName::Braced
        } else {
            FenceName::Tagged(tag_for(slot(resource)))
        }
    }

    /// Writes the counter's name of `resource` (named `self`) to `out`.
    pub fn write(self, resource: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(FENCE_PREFIX);
        match self {
            FenceName::Plain => out.extend_from_slice(resource),
            FenceName::Braced => {
                out.push(b'{');
                out.extend_from_slice(resource);
                out.push(b'}');
            }
            FenceName::Tagged(n) => {
                let mut digits = [0u8; 20];
                out.push(b'{');
                out.extend_from_slice(decimal(n, &mut digits));
                out.push(b'}');
                out.extend_from_slice(resource);
            }
        }
    }

    /// The length of the name [`FenceName::write`] writes for `resource`.
    pub fn len(self, resource: &[u8]) -> usize {
        let mut digits = [0u8; 20];
        FENCE_PREFIX.len()
            + resource.len()
            + match self {
                FenceName::Plain => 0,
                FenceName::Braced => 2,
                FenceName::Tagged(n) => 2 + decimal(n, &mut digits).len(),
            }
    }
}

/// The fence counter's key of `resource`: in the resource's hash slot.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::slot::{fence_key, slot};
///
/// assert_eq!(fence_key(b"orders"), b"quorumlock:fence:{orders}");
/// assert_eq!(fence_key(b"{shop}:a"), b"quorumlock:fence:{shop}:a");
/// assert_eq!(slot(&fence_key(b"a}b")), slot(b"a}b"));
/// ```
pub fn fence_key(resource: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    FenceName::of(resource).write(resource, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_cluster_spec() {
        // From the Redis Cluster specification and `CLUSTER KEYSLOT` on redis-server 7.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"{user1000}.following"), 3443);
        assert_eq!(slot(b"a}b"), 7866);
        assert_eq!(slot(b"x{}y}"), 1123);
        assert_eq!(slot(b"quorumlock:fence:{orders}"), 105);
        assert_eq!(slot(b"orders"), 105);
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_eq!(hash_tag(b"foo{}{bar}"), None);
        assert_eq!(hash_tag(b"foo{{bar}}zap"), Some(&b"{bar"[..]));
        assert_eq!(hash_tag(b"foo{bar}{zap}"), Some(&b"bar"[..]));
        assert_eq!(hash_tag(b"}{"), None);
        assert_eq!(hash_tag(b"{"), None);
    }

    #[test]
    fn a_counter_hashes_like_its_resource_and_names_it() {
        let names: [&[u8]; 14] = [
            b"orders",
            b"{shop}:a",
            b"x{t}y",
            b"a{b",
            b"{",
            b"a}b",
            b"}",
            b"{}",
            b"x{}y}",
            b"}{a}",
            b"foo{}{bar}",
            b"\xff\x00{",
            b"quorumlock:fence:orders",
            b"a b c",
        ];
        for name in names {
            let key = fence_key(name);
            assert_eq!(
                slot(&key),
                slot(name),
                "{:?}",
                key.escape_ascii().to_string()
            );
            assert!(key.starts_with(FENCE_PREFIX));
            assert!(key.ends_with(name) || key.ends_with(&[name, b"}"].concat()));
            assert_eq!(FenceName::of(name).len(name), key.len());
        }
        // Two resources, two counters (but `x` and `{x}`, see the module docs).
        assert_ne!(fence_key(b"a}b"), fence_key(b"a}c"));
        assert_ne!(fence_key(b"ab"), fence_key(b"{ab}:1"));
        assert_eq!(fence_key(b"ab"), fence_key(b"{ab}"));
    }

    #[test]
    fn every_slot_has_a_short_tag() {
        let mut first = vec![None; usize::from(SLOTS)];
        let mut left = SLOTS;
        let mut digits = [0u8; 20];
        let mut n = 0u64;
        while left > 0 {
            let s = usize::from(crc16(decimal(n, &mut digits)) % SLOTS);
            if first[s].is_none() {
                first[s] = Some(n);
                left -= 1;
            }
            n += 1;
        }
        // The search `tag_for` makes ends below this for every slot.
        assert!(n < 1_000_000, "{n}");
        assert_eq!(tag_for(12182), first[12182].unwrap());
    }
}
