//! The properties the RESP2 fuzz targets check, in one file that compiles in two crates:
//! the fuzz crate (`fuzz/src/lib.rs`, under libFuzzer) and the main crate's integration
//! test `tests/fuzz_corpus.rs` (on stable, replaying the committed corpus), which
//! includes it with `#[path]`. It may therefore use only `std`, `quorumlock` and
//! `arbitrary`.
//!
//! Each check panics when a property fails; a panic is what libFuzzer reports as a crash.

// Not every item is used by both includers.
#![allow(dead_code)]

use arbitrary::{Arbitrary, Unstructured};
use quorumlock::__private::resp::encode;
use quorumlock::__private::resp::{Limits, MAX_DEPTH, ProtocolError, Reply, Value, decode};

/// Inputs (or replies) up to this many bytes are also re-parsed at every split point.
/// Quadratic, so bounded to keep the fuzzer fast.
pub const SPLIT_CHECK_MAX: usize = 1024;

/// Re-encoded wire forms up to this many bytes are re-parsed at every split point by the
/// round-trip check; longer ones at a strided sample of split points.
pub const ROUNDTRIP_SPLIT_MAX: usize = 2048;

/// Deepest array nesting the round-trip generator builds.
pub const TREE_MAX_DEPTH: usize = 8;

/// Most nodes (of every kind) the round-trip generator builds per tree.
pub const TREE_MAX_NODES: usize = 256;

/// Most elements the round-trip generator puts in one array.
pub const TREE_MAX_ARRAY: usize = 32;

/// Tight limits, the second fixed set every input is parsed under.
pub const TIGHT: Limits = Limits {
    max_bulk_len: 16,
    max_array_len: 4,
    max_depth: 3,
    max_line_len: 32,
};

/// No limit but the parser's own fixed nesting stack.
pub const GENEROUS: Limits = Limits {
    max_bulk_len: usize::MAX,
    max_array_len: usize::MAX,
    max_depth: MAX_DEPTH,
    max_line_len: usize::MAX,
};

/// Limits chosen by the bits of one byte, so the fuzzer can steer them: two bits each for
/// the bulk, array, depth and line limits. Includes the edge cases 0 and `usize::MAX`
/// (depth 0 and `usize::MAX` are clamped by the parser to 1 and [`MAX_DEPTH`]).
pub fn limits_from_byte(b: u8) -> Limits {
    let pick = |shift: u32, options: [usize; 4]| options[usize::from((b >> shift) & 3)];
    Limits {
        max_bulk_len: pick(0, [0, 3, 16, usize::MAX]),
        max_array_len: pick(2, [0, 1, 4, usize::MAX]),
        max_depth: pick(4, [0, 2, 3, usize::MAX]),
        // 20 = the longest i64, "-9223372036854775808".
        max_line_len: pick(6, [0, 4, 20, usize::MAX]),
    }
}

/// The nesting depth the parser actually enforces for `limits`.
pub fn effective_depth(limits: &Limits) -> usize {
    limits.max_depth.clamp(1, MAX_DEPTH)
}

/// `resp_parse`: arbitrary bytes. The whole input is parsed under [`Limits::default`] and
/// [`TIGHT`]; the input less its first byte under limits chosen by that byte.
pub fn check_parse(data: &[u8]) {
    check_parse_with(data, &Limits::default());
    check_parse_with(data, &TIGHT);
    if let [first, rest @ ..] = data {
        check_parse_with(rest, &limits_from_byte(*first));
    }
}

/// Every property of one parse of `data` under `limits`:
///
/// - `decode` does not panic and is deterministic;
/// - a complete reply consumed `0 < used <= data.len()` bytes, and parses the same from
///   exactly `data[..used]`;
/// - every element respects the limits (bulk and array lengths, line lengths, nesting
///   depth) and every array iterates exactly its `len()` elements;
/// - the reply, copied into a [`Value`] and re-encoded, is no longer than the original,
///   parses back under the same limits to the same value consuming exactly the
///   re-encoding, and re-encodes to the same bytes;
/// - for inputs up to [`SPLIT_CHECK_MAX`] bytes: every strict prefix of a complete reply,
///   and every prefix of an incomplete one, is `Ok(None)`, never an error.
pub fn check_parse_with(data: &[u8], limits: &Limits) {
    let result = decode(data, limits);
    assert_eq!(
        result,
        decode(data, limits),
        "decode is not deterministic on {data:?} under {limits:?}"
    );
    match result {
        Err(_) => {}
        Ok(None) => {
            if data.len() <= SPLIT_CHECK_MAX {
                check_prefixes_incomplete(data, data.len(), limits);
            }
        }
        Ok(Some((reply, used))) => {
            assert!(
                used > 0 && used <= data.len(),
                "consumed {used} of {} bytes: {data:?}",
                data.len()
            );
            assert_eq!(
                decode(&data[..used], limits),
                Ok(Some((reply, used))),
                "the reply's own bytes parse differently: {:?}",
                &data[..used]
            );
            let value = check_reply(&reply, limits, 0);
            assert_eq!(
                value,
                Value::from_reply(&reply),
                "Value::from_reply disagrees"
            );

            let mut wire = Vec::new();
            value.encode(&mut wire);
            assert!(
                wire.len() <= used,
                "re-encoding {value:?} is longer ({}) than the original ({used}): {:?}",
                wire.len(),
                &data[..used]
            );
            match decode(&wire, limits) {
                Ok(Some((again, n))) => {
                    assert_eq!(n, wire.len(), "re-encoding {wire:?} not consumed whole");
                    assert_eq!(
                        Value::from_reply(&again),
                        value,
                        "re-encoding {wire:?} parses to another value"
                    );
                }
                other => panic!(
                    "re-encoding {wire:?} of {:?} does not parse under {limits:?}: {other:?}",
                    &data[..used]
                ),
            }
            let mut again = Vec::new();
            Value::from_reply(&decode(&wire, limits).unwrap().unwrap().0).encode(&mut again);
            assert_eq!(again, wire, "encoding is not canonical");

            if used <= SPLIT_CHECK_MAX {
                check_prefixes_incomplete(data, used, limits);
            }
        }
    }
}

/// Every `data[..cut]` with `cut < end` must be `Ok(None)`.
fn check_prefixes_incomplete(data: &[u8], end: usize, limits: &Limits) {
    for cut in 0..end {
        let prefix = &data[..cut];
        match decode(prefix, limits) {
            Ok(None) => {}
            other => panic!(
                "prefix {prefix:?} (cut at {cut} of {end}) of {:?} under {limits:?}: \
                 want Ok(None), got {other:?}",
                &data[..end]
            ),
        }
    }
}

/// Checks `reply`, found inside `depth` enclosing arrays, against `limits`, and copies
/// it into a [`Value`] by walking it (independently of `Value::from_reply`).
fn check_reply(reply: &Reply<'_>, limits: &Limits, depth: usize) -> Value {
    match *reply {
        Reply::Simple(s) | Reply::Error(s) => {
            assert!(
                s.len() <= limits.max_line_len,
                "line of {} bytes accepted under {limits:?}",
                s.len()
            );
            assert!(!s.contains(&b'\r'), "CR inside an accepted line {s:?}");
            if matches!(reply, Reply::Simple(_)) {
                Value::Simple(s.to_vec())
            } else {
                Value::Error(s.to_vec())
            }
        }
        Reply::Integer(i) => Value::Integer(i),
        Reply::Bulk(None) => Value::Bulk(None),
        Reply::Bulk(Some(b)) => {
            assert!(
                b.len() <= limits.max_bulk_len,
                "bulk of {} bytes accepted under {limits:?}",
                b.len()
            );
            Value::Bulk(Some(b.to_vec()))
        }
        Reply::Array(a) => {
            // The parser clamps max_depth into 1..=MAX_DEPTH, so a flat array is
            // accepted even under max_depth 0; see fuzz/README.md.
            assert!(
                depth < effective_depth(limits),
                "array at depth {} accepted under {limits:?}",
                depth + 1
            );
            let Some(a) = a else {
                return Value::Array(None);
            };
            assert!(
                a.len() <= limits.max_array_len,
                "array of {} elements accepted under {limits:?}",
                a.len()
            );
            assert_eq!(a.is_empty(), a.iter().next().is_none());
            let iter = a.iter();
            assert_eq!(iter.size_hint(), (a.len(), Some(a.len())));
            let items: Vec<Value> = iter.map(|r| check_reply(&r, limits, depth + 1)).collect();
            assert_eq!(
                items.len(),
                a.len(),
                "array of len {} iterated {} elements",
                a.len(),
                items.len()
            );
            Value::Array(Some(items))
        }
    }
}

/// The `resp_roundtrip` input: a reply tree and a second reply pipelined after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundtripInput {
    pub value: Value,
    pub trailing: Value,
}

impl<'a> Arbitrary<'a> for RoundtripInput {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let mut budget = TREE_MAX_NODES;
        let value = arbitrary_value(u, 0, &mut budget)?;
        let trailing = arbitrary_value(u, 0, &mut budget)?;
        Ok(RoundtripInput { value, trailing })
    }
}

/// One value that `Value::encode` can encode faithfully: simple strings and errors
/// without CR or LF, any i64, binary bulk strings (CR, LF, NUL included) or null, arrays
/// null, empty or nested up to [`TREE_MAX_DEPTH`], at most `budget` nodes in all.
fn arbitrary_value(
    u: &mut Unstructured<'_>,
    depth: usize,
    budget: &mut usize,
) -> arbitrary::Result<Value> {
    *budget = budget.saturating_sub(1);
    let kinds = if depth < TREE_MAX_DEPTH && *budget > 0 {
        8
    } else {
        5
    };
    Ok(match u.choose_index(kinds)? {
        0 => Value::Simple(line_bytes(u)?),
        1 => Value::Error(line_bytes(u)?),
        2 => Value::Integer(i64::arbitrary(u)?),
        3 => Value::Bulk(Some(Vec::<u8>::arbitrary(u)?)),
        4 => Value::Bulk(None),
        5 => Value::Array(None),
        _ => {
            // Every element takes at least one byte of input, so trees grow with the
            // input rather than filling up with defaults once it runs out.
            let max = TREE_MAX_ARRAY.min(*budget).min(u.len());
            let len = u.int_in_range(0..=max)?;
            let mut items = Vec::with_capacity(len);
            for _ in 0..len {
                if u.is_empty() {
                    break;
                }
                items.push(arbitrary_value(u, depth + 1, budget)?);
            }
            Value::Array(Some(items))
        }
    })
}

fn line_bytes(u: &mut Unstructured<'_>) -> arbitrary::Result<Vec<u8>> {
    let mut s = Vec::<u8>::arbitrary(u)?;
    s.retain(|&b| b != b'\r' && b != b'\n');
    Ok(s)
}

/// What a tree needs of the limits: each is the least value under which it parses.
#[derive(Clone, Copy, Debug, Default)]
struct Needs {
    /// Longest bulk payload, if there is a non-null bulk.
    bulk: Option<usize>,
    /// Longest array, if there is a non-null array.
    array: Option<usize>,
    /// Deepest array nesting (null and empty arrays count).
    depth: usize,
    /// Longest line without its type byte and CRLF, length lines included.
    line: usize,
}

fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

fn needs(v: &Value, depth: usize, n: &mut Needs) {
    let line = match v {
        Value::Simple(s) | Value::Error(s) => s.len(),
        Value::Integer(i) => digits(i.unsigned_abs()) + usize::from(*i < 0),
        Value::Bulk(None) | Value::Array(None) => 2,
        Value::Bulk(Some(b)) => {
            n.bulk = n.bulk.max(Some(b.len()));
            digits(b.len() as u64)
        }
        Value::Array(Some(items)) => {
            n.array = n.array.max(Some(items.len()));
            digits(items.len() as u64)
        }
    };
    n.line = n.line.max(line);
    if let Value::Array(items) = v {
        n.depth = n.depth.max(depth + 1);
        for item in items.iter().flatten() {
            needs(item, depth + 1, n);
        }
    }
}

/// `resp_roundtrip`: builds a [`RoundtripInput`] from `data` (too little data is fine:
/// `Unstructured` then yields defaults), and checks that:
///
/// - the encoding parses back to the same value, consuming all of it, both under
///   [`GENEROUS`] limits and under the tightest limits the tree allows;
/// - tightening any one of those limits by one is refused with that limit's error;
/// - every strict prefix of the encoding is `Ok(None)`;
/// - with a second reply appended, the first parses the same and consumes the same, and
///   the rest parses to the second;
/// - `encode::command` and `encode::bulk_int` agree with `Value::encode`.
pub fn check_roundtrip(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(input) = RoundtripInput::arbitrary(&mut u) else {
        return;
    };
    let value = &input.value;
    let mut wire = Vec::new();
    value.encode(&mut wire);

    let mut n = Needs::default();
    needs(value, 0, &mut n);
    let exact = Limits {
        max_bulk_len: n.bulk.unwrap_or(0),
        max_array_len: n.array.unwrap_or(0),
        max_depth: n.depth.max(1),
        max_line_len: n.line,
    };
    for limits in [GENEROUS, Limits::default(), exact] {
        if limits == Limits::default() && !fits(&n, &limits) {
            continue;
        }
        match decode(&wire, &limits) {
            Ok(Some((reply, used))) => {
                assert_eq!(used, wire.len(), "{wire:?} not consumed whole");
                assert_eq!(&check_reply(&reply, &limits, 0), value, "{wire:?}");
                assert_eq!(&Value::from_reply(&reply), value, "{wire:?}");
            }
            other => panic!("{wire:?} of {value:?} under {limits:?}: {other:?}"),
        }
    }

    // One limit at a time, one below what the tree needs.
    let mut tighter = Vec::new();
    if let Some(b @ 1..) = n.bulk {
        let l = Limits {
            max_bulk_len: b - 1,
            ..exact
        };
        tighter.push((l, ProtocolError::BulkTooLong));
    }
    if let Some(a @ 1..) = n.array {
        let l = Limits {
            max_array_len: a - 1,
            ..exact
        };
        tighter.push((l, ProtocolError::ArrayTooLong));
    }
    if n.depth >= 2 {
        let l = Limits {
            max_depth: n.depth - 1,
            ..exact
        };
        tighter.push((l, ProtocolError::TooDeep));
    }
    if n.line >= 1 {
        let l = Limits {
            max_line_len: n.line - 1,
            ..exact
        };
        tighter.push((l, ProtocolError::LineTooLong));
    }
    for (limits, err) in tighter {
        assert_eq!(
            decode(&wire, &limits),
            Err(err),
            "{wire:?} of {value:?} under {limits:?}"
        );
    }

    // Every strict prefix is incomplete (all of them for small encodings, a strided
    // sample plus both ends for large ones).
    let step = wire.len().div_ceil(ROUNDTRIP_SPLIT_MAX).max(1);
    let tail = if step == 1 {
        wire.len()
    } else {
        wire.len().saturating_sub(64)
    };
    let cuts = (0..wire.len()).step_by(step).chain(tail..wire.len());
    for cut in cuts {
        assert_eq!(
            decode(&wire[..cut], &GENEROUS),
            Ok(None),
            "prefix {:?} (cut at {cut}) of {wire:?}",
            &wire[..cut]
        );
    }

    // Pipelined: a second reply after the first.
    let mut stream = wire.clone();
    input.trailing.encode(&mut stream);
    match decode(&stream, &GENEROUS) {
        Ok(Some((reply, used))) => {
            assert_eq!(used, wire.len(), "{stream:?}");
            assert_eq!(&Value::from_reply(&reply), value, "{stream:?}");
        }
        other => panic!("{stream:?}: {other:?}"),
    }
    match decode(&stream[wire.len()..], &GENEROUS) {
        Ok(Some((reply, used))) => {
            assert_eq!(used, stream.len() - wire.len(), "{stream:?}");
            assert_eq!(Value::from_reply(&reply), input.trailing, "{stream:?}");
        }
        other => panic!("{stream:?}: {other:?}"),
    }

    check_encoders(value);
    check_encoders(&input.trailing);
}

fn fits(n: &Needs, l: &Limits) -> bool {
    n.bulk.unwrap_or(0) <= l.max_bulk_len
        && n.array.unwrap_or(0) <= l.max_array_len
        && n.depth <= effective_depth(l)
        && n.line <= l.max_line_len
}

/// The command encoders against `Value::encode`.
fn check_encoders(v: &Value) {
    match v {
        Value::Integer(i) => {
            let mut got = Vec::new();
            encode::bulk_int(&mut got, *i);
            let mut want = Vec::new();
            Value::Bulk(Some(i.to_string().into_bytes())).encode(&mut want);
            assert_eq!(got, want, "bulk_int({i})");
        }
        Value::Array(Some(items)) => {
            let args: Option<Vec<&[u8]>> = items
                .iter()
                .map(|item| match item {
                    Value::Bulk(Some(b)) => Some(&b[..]),
                    _ => None,
                })
                .collect();
            if let Some(args) = args {
                let mut got = Vec::new();
                encode::command(&mut got, &args);
                let mut want = Vec::new();
                v.encode(&mut want);
                assert_eq!(got, want, "command({args:?})");
            }
            for item in items {
                check_encoders(item);
            }
        }
        _ => {}
    }
}
