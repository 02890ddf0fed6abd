//! The properties the RESP2 fuzz targets check, in one file that compiles in two crates:
//! the fuzz crate (`fuzz/src/lib.rs`, under libFuzzer) and the main crate's integration
//! test `tests/fuzz_corpus.rs` (on stable, replaying the committed corpus), which
//! includes it with `#[path]`. It may therefore use only `std`, `quorumlock` and
//! `arbitrary`.
//!
//! Each check panics when a property fails; a panic is what libFuzzer reports as a crash.

// Not every item is used by both includers.
#![allow(dead_code)]

use std::io::Write;

use arbitrary::{Arbitrary, Unstructured};
use quorumlock::__private::resp::encode;
use quorumlock::__private::resp::{
    Limits, MAX_DEPTH, Progress, ProtocolError, Reply, Value, decode, decode_resume,
};

/// Most chunks `resp_split` feeds per input and per set of limits; the rest of a longer
/// input arrives in one last chunk. Each step re-parses from the current reply's start,
/// so this bounds the work per input to about `SPLIT_MAX_STEPS * len`.
pub const SPLIT_MAX_STEPS: usize = 512;

/// Most chunk sizes a `resp_split` input carries in its header (cycled through).
pub const SPLIT_MAX_SIZES: usize = 7;

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

/// `resp_parse`: arbitrary bytes, each parsed once per set of limits, with no re-parse
/// at split points (that is `resp_split`, [`check_split`]), so that it runs fast. The
/// whole input is parsed under [`Limits::default`] and [`TIGHT`]; the input less its
/// first byte under limits chosen by that byte.
pub fn check_parse(data: &[u8]) {
    check_parse_with(data, &Limits::default());
    check_parse_with(data, &TIGHT);
    if let [first, rest @ ..] = data {
        check_parse_with(rest, &limits_from_byte(*first));
    }
}

/// Every property of one parse of `data` under `limits`, with no re-parse at split
/// points (that is [`check_split`]):
///
/// - `decode` does not panic, and `decode_resume` from a fresh [`Progress`] answers the
///   same (both start from scratch, so this is also determinism);
/// - a complete reply consumed `0 < used <= data.len()` bytes, and parses the same from
///   exactly `data[..used]`;
/// - every element respects the limits (bulk and array lengths, line lengths, nesting
///   depth), no line holds CR or LF, and every array iterates exactly its `len()`
///   elements;
/// - the reply's canonical form (written by the check's own encoder, checked against
///   `Value::encode` by [`check_roundtrip`]) is no longer than the original, parses back
///   under the same limits consuming all of it, and to a reply with the same canonical
///   form (the same value).
pub fn check_parse_with(data: &[u8], limits: &Limits) {
    let result = decode(data, limits);
    // Both start from scratch on the same bytes, so this is also determinism.
    assert_eq!(
        decode_resume(data, limits, &mut Progress::default()),
        result,
        "decode_resume from a fresh Progress differs from decode on {data:?} under {limits:?}"
    );
    let Ok(Some((reply, used))) = result else {
        return;
    };
    assert!(
        used > 0 && used <= data.len(),
        "consumed {used} of {} bytes: {data:?}",
        data.len()
    );
    if used < data.len() {
        assert_eq!(
            decode(&data[..used], limits),
            result,
            "the reply's own bytes parse differently: {:?}",
            &data[..used]
        );
    }
    let mut wire = Vec::new();
    check_reply(&reply, limits, 0, &mut wire);
    assert!(
        wire.len() <= used,
        "the canonical form {wire:?} is longer ({}) than the original ({used}): {:?}",
        wire.len(),
        &data[..used]
    );
    match decode(&wire, limits) {
        Ok(Some((again, n))) => {
            assert_eq!(n, wire.len(), "canonical form {wire:?} not consumed whole");
            // Same canonical form, same value: nothing lost or changed, and the form is
            // a fixed point.
            let mut again_wire = Vec::with_capacity(wire.len());
            check_reply(&again, limits, 0, &mut again_wire);
            assert!(
                again_wire == wire,
                "canonical form {} parses to another value, whose form is {}",
                wire.escape_ascii(),
                again_wire.escape_ascii()
            );
        }
        other => panic!(
            "canonical form {wire:?} of {:?} does not parse under {limits:?}: {other:?}",
            &data[..used]
        ),
    }
}

/// `resp_split`: the input is `[n, sizes[..n % 8], payload..]`: a header of chunk sizes
/// (each byte `b` is a chunk of `b + 1` bytes, cycled through; none means one byte at a
/// time), then a stream of replies. The payload is fed in those chunks, at most
/// [`SPLIT_MAX_STEPS`] of them (then the rest at once), under [`Limits::default`] and
/// [`TIGHT`]; see [`check_split_with`]. An input too short for its header is checked with
/// an empty payload.
pub fn check_split(data: &[u8]) {
    let (sizes, payload) = match data {
        [] => (&[][..], &[][..]),
        [n, rest @ ..] => {
            let n = usize::from(*n) % (SPLIT_MAX_SIZES + 1);
            rest.split_at(n.min(rest.len()))
        }
    };
    for limits in [Limits::default(), TIGHT] {
        check_split_with(payload, sizes, &limits);
    }
}

/// Feeds `input` (a stream of replies) in chunks of the sizes `sizes` gives, as a
/// connection reads it, and after every chunk, for the reply that starts at `start` (the
/// bytes of the earlier replies consumed) and the bytes `input[start..end]` read so far:
///
/// - `decode_resume`, carrying its [`Progress`] from chunk to chunk within the reply,
///   answers exactly as `decode` on the same bytes (the same reply and length, or
///   `Ok(None)`, or the same error);
/// - the answer does not depend on where the bytes were split: `decode` of the bytes so
///   far is `Ok(None)` while they are a strict prefix of what `decode` of the whole rest
///   `input[start..]` consumes, and that same answer once they cover it. An error may
///   come early, but only the same error as on the whole rest;
/// - after a complete reply, the next one starts right after it (both decoders are asked
///   again without new bytes, as a connection does with pipelined replies).
///
/// Stops at the first error (a connection is dropped there).
pub fn check_split_with(input: &[u8], sizes: &[u8], limits: &Limits) {
    let mut progress = Progress::default();
    let mut start = 0; // where the current reply begins
    let mut whole = decode(input, limits); // the answer on all of input[start..]
    let mut end = 0;
    let mut steps = 0;
    while end < input.len() {
        let chunk = if steps >= SPLIT_MAX_STEPS {
            input.len()
        } else if sizes.is_empty() {
            1
        } else {
            usize::from(sizes[steps % sizes.len()]) + 1
        };
        steps += 1;
        end = end.saturating_add(chunk).min(input.len());
        loop {
            let buf = &input[start..end];
            let fresh = decode(buf, limits);
            let resumed = decode_resume(buf, limits, &mut progress);
            assert_eq!(
                resumed,
                fresh,
                "decode_resume differs from decode on \"{}\" at {start}..{end} (step {steps}) \
                 of \"{}\" under {limits:?}",
                buf.escape_ascii(),
                input.escape_ascii()
            );
            match (&whole, &fresh) {
                (Ok(Some((_, used))), _) if buf.len() >= *used => assert_eq!(
                    fresh,
                    whole,
                    "\"{}\" at {start}..{end} of \"{}\" under {limits:?}: the first {used} bytes \
                     hold the whole reply",
                    buf.escape_ascii(),
                    input.escape_ascii()
                ),
                (_, Ok(None)) => {}
                (Err(e), Err(f)) if e == f => {}
                _ => panic!(
                    "\"{}\" at {start}..{end} of \"{}\" under {limits:?} gives {fresh:?}, but \
                     all of \"{}\" gives {whole:?}: the answer depends on the split",
                    buf.escape_ascii(),
                    input.escape_ascii(),
                    input[start..].escape_ascii()
                ),
            }
            match fresh {
                Ok(Some((_, used))) => {
                    start += used;
                    whole = decode(&input[start..], limits);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

/// Checks `reply`, found inside `depth` enclosing arrays, against `limits` by walking
/// it once: line, bulk and array lengths, nesting depth, no CR or LF in a line, and every
/// array iterates exactly its `len()` elements. Appends the canonical wire form of
/// `reply` to `out` on the way (its own encoder, independent of `Value::encode`).
fn check_reply(reply: &Reply<'_>, limits: &Limits, depth: usize, out: &mut Vec<u8>) {
    match *reply {
        Reply::Simple(s) | Reply::Error(s) => {
            assert!(
                s.len() <= limits.max_line_len,
                "line of {} bytes accepted under {limits:?}",
                s.len()
            );
            assert!(
                !s.iter().any(|&b| b == b'\r' || b == b'\n'),
                "CR or LF inside an accepted line {s:?}"
            );
            out.push(if matches!(reply, Reply::Simple(_)) {
                b'+'
            } else {
                b'-'
            });
            out.extend_from_slice(s);
            out.extend_from_slice(b"\r\n");
        }
        Reply::Integer(i) => {
            write!(out, ":{i}\r\n").unwrap();
        }
        Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
        Reply::Bulk(Some(b)) => {
            assert!(
                b.len() <= limits.max_bulk_len,
                "bulk of {} bytes accepted under {limits:?}",
                b.len()
            );
            write!(out, "${}\r\n", b.len()).unwrap();
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
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
                out.extend_from_slice(b"*-1\r\n");
                return;
            };
            assert!(
                a.len() <= limits.max_array_len,
                "array of {} elements accepted under {limits:?}",
                a.len()
            );
            write!(out, "*{}\r\n", a.len()).unwrap();
            let mut iter = a.iter();
            assert_eq!(iter.size_hint(), (a.len(), Some(a.len())));
            let mut n = 0;
            for r in iter.by_ref() {
                check_reply(&r, limits, depth + 1, out);
                n += 1;
            }
            assert_eq!(n, a.len(), "array of len {} iterated {n} elements", a.len());
            assert_eq!(iter.size_hint(), (0, Some(0)));
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
                let mut again = Vec::with_capacity(wire.len());
                check_reply(&reply, &limits, 0, &mut again);
                assert_eq!(
                    again, wire,
                    "the checks' encoder disagrees with Value::encode"
                );
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
