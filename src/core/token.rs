//! Lock values: 128 random bits, as 32 lowercase hex digits, stored inline.
//!
//! # Invariants
//!
//! - Two generators, each seeded with 64 bits read once from `/dev/urandom`, give the
//!   two halves of every token, so the generator state is 128 bits and two processes (or
//!   two clients in one process) collide only if all 128 seed bits do.
//! - Making a token never allocates and never makes a system call.
//! - A generator must not be shared across `fork()`: parent and child would draw the
//!   same sequence. Build a new client in the child.

use std::fmt;
use std::io::Read;

/// One lock value: unique per lock request, what release and extend compare against.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token([u8; 32]);

impl Token {
    /// The token as it is stored in Redis.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The token as a fixed-size array (lets encoders copy it with constant-size moves).
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::core::token::Token;
    ///
    /// let token = Token::from_bits(u128::MAX);
    /// assert_eq!(token.as_array(), &[b'f'; 32]);
    /// ```
    pub fn as_array(&self) -> &[u8; 32] {
        &self.0
    }

    /// Builds a token from 128 bits (for tests and callers with their own entropy).
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::core::token::Token;
    ///
    /// assert_eq!(Token::from_bits(0xab).as_bytes(), b"000000000000000000000000000000ab");
    /// ```
    #[inline]
    pub fn from_bits(bits: u128) -> Token {
        let mut out = [0u8; 32];
        out[..16].copy_from_slice(&hex16((bits >> 64) as u64));
        out[16..].copy_from_slice(&hex16(bits as u64));
        Token(out)
    }
}

/// The 16 lowercase hex digits of `v`, most significant first, without a table or a
/// loop: each nibble is spread into its own byte, then mapped to ASCII in parallel.
#[inline]
fn hex16(v: u64) -> [u8; 16] {
    const LOW_NIBBLES: u128 = 0x0f0f_0f0f_0f0f_0f0f_0f0f_0f0f_0f0f_0f0f;
    const ONES: u128 = 0x0101_0101_0101_0101_0101_0101_0101_0101;
    let mut x = u128::from(v);
    // Nibble j of v ends up in byte j of x.
    x = (x | (x << 32)) & 0x0000_0000_ffff_ffff_0000_0000_ffff_ffff;
    x = (x | (x << 16)) & 0x0000_ffff_0000_ffff_0000_ffff_0000_ffff;
    x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff_00ff_00ff_00ff_00ff;
    x = (x | (x << 4)) & LOW_NIBBLES;
    // 1 in every byte whose nibble is 10..=15: adding 6 carries into bit 4.
    let letters = ((x + 6 * ONES) >> 4) & ONES;
    // '0' + d for digits, 'a' + d - 10 = '0' + d + 39 for letters.
    (x + 0x30 * ONES + 39 * letters).to_be_bytes()
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Always ASCII hex by construction.
        f.write_str(std::str::from_utf8(&self.0).unwrap_or("<token>"))
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Source of tokens (and of retry jitter), seeded from OS entropy.
///
/// # Example
///
/// ```
/// use quorumlock::core::token::TokenSource;
///
/// let mut source = TokenSource::from_os();
/// let (a, b) = (source.next_token(), source.next_token());
/// assert_ne!(a, b);
/// assert_eq!(a.as_bytes().len(), 32);
/// ```
#[derive(Debug)]
pub struct TokenSource {
    high: fastrand::Rng,
    low: fastrand::Rng,
}

impl TokenSource {
    /// Seeds from 16 bytes of `/dev/urandom`. If that cannot be read (no `/dev`, a
    /// sandbox), falls back to mixing the time, the process id and address-space layout
    /// into the seed; unique in practice, but not unpredictable.
    pub fn from_os() -> TokenSource {
        let mut seed = [0u8; 16];
        let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut seed));
        if read.is_err() {
            seed = fallback_seed();
        }
        let (high, low) = seed.split_at(8);
        TokenSource::from_seed(
            u64::from_le_bytes(high.try_into().unwrap_or_default()),
            u64::from_le_bytes(low.try_into().unwrap_or_default()),
        )
    }

    /// A deterministic source, for tests and simulations.
    pub fn from_seed(high: u64, low: u64) -> TokenSource {
        TokenSource {
            high: fastrand::Rng::with_seed(high),
            low: fastrand::Rng::with_seed(low ^ 0x9e37_79b9_7f4a_7c15),
        }
    }

    /// The next token.
    pub fn next_token(&mut self) -> Token {
        let bits = (u128::from(self.high.u64(..)) << 64) | u128::from(self.low.u64(..));
        Token::from_bits(bits)
    }

    /// A random duration in `[center − spread, center + spread]` (never below zero),
    /// for the delay between attempts.
    pub fn jitter(
        &mut self,
        center: std::time::Duration,
        spread: std::time::Duration,
    ) -> std::time::Duration {
        let micros = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let lo = micros(center.saturating_sub(spread));
        let hi = micros(center.saturating_add(spread));
        std::time::Duration::from_micros(self.low.u64(lo..=hi))
    }
}

fn fallback_seed() -> [u8; 16] {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let local = 0u8;
    let addr = &local as *const u8 as usize as u128;
    let mixed = now ^ (u128::from(std::process::id()) << 64) ^ addr.rotate_left(32);
    mixed.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::Duration;

    #[test]
    fn tokens_are_hex_and_distinct() {
        let mut source = TokenSource::from_os();
        let mut seen = HashSet::new();
        for _ in 0..10_000 {
            let t = source.next_token();
            assert!(
                t.as_bytes()
                    .iter()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
            assert!(seen.insert(t));
        }
    }

    #[test]
    fn two_sources_from_the_os_differ() {
        assert_ne!(
            TokenSource::from_os().next_token(),
            TokenSource::from_os().next_token()
        );
    }

    #[test]
    fn from_bits_is_big_endian_hex() {
        assert_eq!(
            Token::from_bits(0xab).as_bytes(),
            b"000000000000000000000000000000ab"
        );
        assert_eq!(Token::from_bits(u128::MAX).as_bytes(), &[b'f'; 32]);
        // Against the obvious formatting, over every nibble value in every position.
        let mut source = TokenSource::from_seed(3, 4);
        let mut bits: Vec<u128> = (0..5000)
            .map(|_| (u128::from(source.high.u64(..)) << 64) | u128::from(source.low.u64(..)))
            .collect();
        for pos in 0..32 {
            for d in 0..16u128 {
                bits.push(d << (4 * pos));
                bits.push(!(d << (4 * pos)));
            }
        }
        for b in bits {
            assert_eq!(
                Token::from_bits(b).as_bytes(),
                format!("{b:032x}").as_bytes()
            );
        }
    }

    #[test]
    fn jitter_stays_in_range() {
        let mut source = TokenSource::from_seed(1, 2);
        for _ in 0..1000 {
            let d = source.jitter(Duration::from_millis(200), Duration::from_millis(100));
            assert!(d >= Duration::from_millis(100) && d <= Duration::from_millis(300));
        }
        assert_eq!(
            source.jitter(Duration::from_millis(5), Duration::ZERO),
            Duration::from_millis(5)
        );
        assert!(
            source.jitter(Duration::from_millis(5), Duration::from_millis(50))
                <= Duration::from_millis(55)
        );
        // Durations past u64 microseconds saturate instead of wrapping into an empty range.
        let huge = source.jitter(Duration::MAX, Duration::from_millis(1));
        assert!(huge >= Duration::from_micros(u64::MAX - 1000));
    }
}
