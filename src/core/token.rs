//! Lock values: 128 random bits, as 32 lowercase hex digits, stored inline; or a value
//! the caller chose ([`Token::given`]).
//!
//! # Invariants
//!
//! - A token of 32 bytes is always stored inline (`Repr::Inline`), whoever made it; any
//!   other length lives behind an `Arc` (`Repr::Shared`). One representation per value,
//!   so equality and hashing compare bytes, and the encoders' constant-size fast path
//!   serves every 32-byte token.
//! - A token is 1 to [`MAX_TOKEN`] bytes.
//! - Every token is 128 bits straight from the OS CSPRNG (`/dev/urandom`), read in
//!   blocks: a token is a credential, so no non-cryptographic generator and no
//!   time- or pid-based fallback ever makes one.
//! - Making a token never allocates; one system call in 64 tokens refills the block.
//! - A source must not be shared across `fork()`: parent and child would hand out the
//!   same unused bytes. Build a new client in the child.

use std::fmt;
use std::io::{self, Read};
use std::sync::Arc;

/// The longest token a caller may give ([`Token::given`]), in bytes: every command that
/// carries a token stays bounded.
pub const MAX_TOKEN: usize = 128;

/// One lock value: unique per lock request, what release and extend compare against.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    /// Every 32-byte token: the crate's own, and a given one of that length.
    Inline([u8; 32]),
    /// A given token of any other length (1 to [`MAX_TOKEN`] bytes).
    Shared(Arc<[u8]>),
}

/// Why bytes cannot be a token ([`Token::given`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenProblem {
    /// No bytes: an empty value would match any other empty value.
    Empty,
    /// Longer than [`MAX_TOKEN`] bytes.
    TooLong,
}

impl fmt::Display for TokenProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenProblem::Empty => f.write_str("empty: a lock value must name its holder"),
            TokenProblem::TooLong => write!(f, "longer than {MAX_TOKEN} bytes"),
        }
    }
}

impl Token {
    /// The token as it is stored in Redis.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline(bytes) => bytes,
            Repr::Shared(bytes) => bytes,
        }
    }

    /// The token as a fixed-size array when it is 32 bytes long, as every token this
    /// crate makes is (lets encoders copy it with constant-size moves).
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::__private::core::token::Token;
    ///
    /// let token = Token::from_bits(u128::MAX);
    /// assert_eq!(token.as_array(), Some(&[b'f'; 32]));
    /// assert_eq!(Token::given(b"worker-7").unwrap().as_array(), None);
    /// ```
    #[inline]
    pub fn as_array(&self) -> Option<&[u8; 32]> {
        match &self.0 {
            Repr::Inline(bytes) => Some(bytes),
            Repr::Shared(_) => None,
        }
    }

    /// A token the caller chose (a system that names its holders): any 1 to
    /// [`MAX_TOKEN`] bytes. Its uniqueness is the caller's to keep: two holders with
    /// one value can extend and release each other's locks.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::__private::core::token::{Token, TokenProblem};
    ///
    /// let t = Token::given(b"host-3:pid-812:job-42").unwrap();
    /// assert_eq!(t.as_bytes(), b"host-3:pid-812:job-42");
    /// assert_eq!(Token::given(b""), Err(TokenProblem::Empty));
    /// assert_eq!(Token::given(&[b'x'; 129]), Err(TokenProblem::TooLong));
    /// ```
    pub fn given(bytes: &[u8]) -> Result<Token, TokenProblem> {
        match bytes.len() {
            0 => Err(TokenProblem::Empty),
            32 => Ok(Token(Repr::Inline(bytes.try_into().unwrap_or([0; 32])))),
            n if n > MAX_TOKEN => Err(TokenProblem::TooLong),
            _ => Ok(Token(Repr::Shared(bytes.into()))),
        }
    }

    /// Builds a token from 128 bits (for tests and callers with their own entropy).
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::__private::core::token::Token;
    ///
    /// assert_eq!(Token::from_bits(0xab).as_bytes(), b"000000000000000000000000000000ab");
    /// ```
    #[inline]
    pub fn from_bits(bits: u128) -> Token {
        let mut out = [0u8; 32];
        out[..16].copy_from_slice(&hex16((bits >> 64) as u64));
        out[16..].copy_from_slice(&hex16(bits as u64));
        Token(Repr::Inline(out))
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
        // The whole value is a credential (whoever has it can extend or release the
        // lock): only a prefix, as every type that holds one shows it.
        fmt::Debug::fmt(&Prefix(self.as_bytes()), f)
    }
}

/// A token in `Debug` and `Display` output: enough of its start to tell locks apart in
/// logs (a quarter of it, at most 8 bytes, escaped, then `…`), never the whole
/// credential. Every public type that holds a token formats it through this.
pub struct Prefix<'a>(pub &'a [u8]);

impl Prefix<'_> {
    /// How many bytes of a token of `len` bytes are shown.
    pub const fn shown(len: usize) -> usize {
        let quarter = len / 4;
        if quarter < 8 { quarter } else { 8 }
    }
}

impl fmt::Debug for Prefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = &self.0[..Prefix::shown(self.0.len())];
        write!(f, "{}…", shown.escape_ascii())
    }
}

impl fmt::Display for Prefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Tokens read in one `read` from the OS random source: 64 tokens, so the system call
/// is paid once per 64 locks, not once per lock.
const BLOCK: usize = 64 * 16;

/// Source of tokens (and of retry jitter).
///
/// Every token is 128 bits read from the operating system's CSPRNG (`/dev/urandom`), in
/// blocks of 1 KiB that are handed out 16 bytes at a time: a token is a credential
/// (whoever can predict it can release or extend the lock), so it never comes from a
/// seeded non-cryptographic generator, and there is no time- or pid-based fallback: if
/// the OS source cannot be read, [`TokenSource::from_os`] and
/// [`TokenSource::next_token`] say so. Retry jitter, which needs no secrecy, comes from
/// `fastrand`.
///
/// Bytes already read are not shared with a `fork()`ed child only if the child builds
/// its own client: a source copied across `fork()` would hand out the same tokens in
/// parent and child.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::token::TokenSource;
///
/// let mut source = TokenSource::from_os()?;
/// let (a, b) = (source.next_token()?, source.next_token()?);
/// assert_ne!(a, b);
/// assert_eq!(a.as_bytes().len(), 32);
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct TokenSource {
    entropy: Entropy,
    block: Box<[u8; BLOCK]>,
    // INVARIANT: used <= BLOCK; block[used..] has not been handed out.
    used: usize,
    jitter: fastrand::Rng,
}

enum Entropy {
    /// `/dev/urandom`, kept open: a process that later loses `/dev` (a chroot, a
    /// sandbox) can still make tokens.
    Os(std::fs::File),
    /// A seeded generator, for tests and simulations only: predictable by design.
    Seeded(fastrand::Rng),
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the unused bytes: they are the next tokens.
        let kind = match self.entropy {
            Entropy::Os(_) => "os",
            Entropy::Seeded(_) => "seeded",
        };
        f.debug_struct("TokenSource")
            .field("entropy", &kind)
            .finish_non_exhaustive()
    }
}

impl TokenSource {
    /// Opens the OS random source and reads the first block, so that a machine without
    /// one fails here, when the client is built, not at the first lock.
    pub fn from_os() -> io::Result<TokenSource> {
        let file = std::fs::File::open("/dev/urandom")?;
        let mut source = TokenSource {
            entropy: Entropy::Os(file),
            block: Box::new([0; BLOCK]),
            used: BLOCK,
            jitter: fastrand::Rng::new(),
        };
        source.refill()?;
        Ok(source)
    }

    /// A deterministic source, for tests and simulations. Its tokens are predictable:
    /// never use it to lock anything real.
    pub fn from_seed(high: u64, low: u64) -> TokenSource {
        TokenSource {
            entropy: Entropy::Seeded(fastrand::Rng::with_seed(high)),
            block: Box::new([0; BLOCK]),
            used: BLOCK,
            jitter: fastrand::Rng::with_seed(low ^ 0x9e37_79b9_7f4a_7c15),
        }
    }

    /// The next token: 16 bytes of the current block, a new block when it is used up.
    #[inline]
    pub fn next_token(&mut self) -> io::Result<Token> {
        if self.used == BLOCK {
            self.refill()?;
        }
        let bytes = self.block[self.used..self.used + 16]
            .try_into()
            .unwrap_or([0; 16]);
        // Each byte is handed out once: wipe it, so a copy of the source made later
        // (a core dump, a `Debug` added by mistake) does not hold tokens in use.
        self.block[self.used..self.used + 16].fill(0);
        self.used += 16;
        Ok(Token::from_bits(u128::from_le_bytes(bytes)))
    }

    #[cold]
    fn refill(&mut self) -> io::Result<()> {
        match &mut self.entropy {
            Entropy::Os(file) => file.read_exact(&mut self.block[..])?,
            Entropy::Seeded(rng) => rng.fill(&mut self.block[..]),
        }
        self.used = 0;
        Ok(())
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
        std::time::Duration::from_micros(self.jitter.u64(lo..=hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::Duration;

    #[test]
    fn tokens_are_hex_and_distinct() {
        let mut source = TokenSource::from_os().unwrap();
        let mut seen = HashSet::new();
        // Many blocks: refills must hand out fresh bytes, never a wiped or repeated block.
        for _ in 0..10_000 {
            let t = source.next_token().unwrap();
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
            TokenSource::from_os().unwrap().next_token().unwrap(),
            TokenSource::from_os().unwrap().next_token().unwrap()
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
        let mut rng = fastrand::Rng::with_seed(3);
        let mut bits: Vec<u128> = (0..5000).map(|_| rng.u128(..)).collect();
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
    fn a_token_is_the_os_bytes_in_order_and_none_repeats_across_refills() {
        let mut seeded = TokenSource::from_seed(7, 8);
        let mut expected = [0u8; BLOCK * 3];
        fastrand::Rng::with_seed(7).fill(&mut expected);
        for chunk in expected.chunks(16) {
            let bits = u128::from_le_bytes(chunk.try_into().unwrap());
            assert_eq!(seeded.next_token().unwrap(), Token::from_bits(bits));
        }
    }

    #[test]
    fn debug_never_shows_unused_entropy() {
        let source = TokenSource::from_os().unwrap();
        let shown = format!("{source:?}");
        assert_eq!(shown, "TokenSource { entropy: \"os\", .. }");
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
