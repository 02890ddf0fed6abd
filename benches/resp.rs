//! RESP2 codec micro-benchmarks: no I/O, pure CPU.
//!
//! Run: `cargo bench --bench resp` (add `-- --warm-up-time 1 --measurement-time 3` for a
//! quick pass). Every iteration checks its result, so a broken codec cannot look fast.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use quorumlock::__private::core::command;
use quorumlock::__private::core::script::RELEASE_SHA;
use quorumlock::__private::core::token::Token;
use quorumlock::__private::resp::{Limits, Reply, decode, encode};
use std::hint::black_box;

const KEY: &[u8] = b"orders:42";
const TTL_MS: i64 = 30_000;

fn expected_set(token: &Token) -> Vec<u8> {
    let mut want = Vec::new();
    encode::command(
        &mut want,
        &[
            &b"SET"[..],
            KEY,
            token.as_bytes(),
            b"NX",
            b"PX",
            TTL_MS.to_string().as_bytes(),
        ],
    );
    want
}

fn bench_encode(c: &mut Criterion) {
    let token = Token::from_bits(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    let want = expected_set(&token);
    let mut g = c.benchmark_group("encode");
    g.throughput(Throughput::Bytes(want.len() as u64));

    // The library's own path: core::command::acquire into a reused buffer.
    let mut out: Vec<u8> = Vec::with_capacity(256);
    g.bench_function("set_nx_px/command::acquire", |b| {
        b.iter(|| {
            out.clear();
            command::acquire(
                &mut out,
                black_box(KEY),
                black_box(&token),
                black_box(TTL_MS as u64),
            );
            assert_eq!(out.len(), want.len());
            black_box(&out);
        })
    });
    assert_eq!(out, want, "command::acquire is not SET key token NX PX ttl");

    // The same bytes through the generic encoder, ttl formatted on the stack.
    let mut out2: Vec<u8> = Vec::with_capacity(256);
    g.bench_function("set_nx_px/resp::encode", |b| {
        b.iter(|| {
            out2.clear();
            encode::array(&mut out2, 6);
            encode::bulk(&mut out2, b"SET");
            encode::bulk(&mut out2, black_box(KEY));
            encode::bulk(&mut out2, black_box(token.as_bytes()));
            encode::bulk(&mut out2, b"NX");
            encode::bulk(&mut out2, b"PX");
            encode::bulk_int(&mut out2, black_box(TTL_MS));
            assert_eq!(out2.len(), want.len());
            black_box(&out2);
        })
    });
    assert_eq!(out2, want);

    // The release that follows every lock: EVALSHA sha 1 key token.
    let mut rel: Vec<u8> = Vec::with_capacity(256);
    command::release(&mut rel, KEY, &token, true);
    let rel_len = rel.len();
    assert!(rel.windows(RELEASE_SHA.len()).any(|w| w == RELEASE_SHA));
    g.throughput(Throughput::Bytes(rel_len as u64));
    g.bench_function("evalsha_release/command::release", |b| {
        b.iter(|| {
            rel.clear();
            command::release(&mut rel, black_box(KEY), black_box(&token), true);
            assert_eq!(rel.len(), rel_len);
            black_box(&rel);
        })
    });
    g.finish();
}

fn bench_decode_small(c: &mut Criterion) {
    let limits = Limits::default();
    let mut g = c.benchmark_group("decode");
    let cases: [(&str, &[u8], Reply<'static>); 4] = [
        ("ok", b"+OK\r\n", Reply::Simple(b"OK")),
        ("nil", b"$-1\r\n", Reply::Bulk(None)),
        ("int", b":1\r\n", Reply::Integer(1)),
        (
            "noscript",
            b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
            Reply::Error(b"NOSCRIPT No matching script. Please use EVAL."),
        ),
    ];
    for (name, wire, want) in cases {
        g.throughput(Throughput::Bytes(wire.len() as u64));
        g.bench_with_input(BenchmarkId::new("small", name), &wire, |b, wire| {
            b.iter(|| {
                let (reply, used) = decode(black_box(wire), &limits).unwrap().unwrap();
                assert_eq!(used, wire.len());
                assert_eq!(reply, want);
                black_box(reply);
            })
        });
    }

    // 256 pipelined replies, as a batch of try_lock_many/unlock_many sees them.
    let mut batch = Vec::new();
    let pattern: [&[u8]; 4] = [b"+OK\r\n", b"$-1\r\n", b":1\r\n", b":0\r\n"];
    for i in 0..256 {
        batch.extend_from_slice(pattern[i % 4]);
    }
    g.throughput(Throughput::Elements(256));
    g.bench_function("pipelined_256/elements", |b| {
        b.iter(|| {
            let mut buf: &[u8] = black_box(&batch);
            let (mut n, mut ok) = (0usize, 0usize);
            while let Some((reply, used)) = decode(buf, &limits).unwrap() {
                ok += usize::from(matches!(reply, Reply::Simple(b"OK")));
                buf = &buf[used..];
                n += 1;
            }
            assert!(buf.is_empty());
            assert_eq!((n, ok), (256, 64));
            black_box(n)
        })
    });
    g.throughput(Throughput::Bytes(batch.len() as u64));
    g.bench_function("pipelined_256/bytes", |b| {
        b.iter(|| {
            let mut buf: &[u8] = black_box(&batch);
            let mut n = 0usize;
            while let Some((_, used)) = decode(buf, &limits).unwrap() {
                buf = &buf[used..];
                n += 1;
            }
            assert_eq!(n, 256);
            black_box(n)
        })
    });

    // One 64 KiB bulk string: the parser must find the terminator without scanning the
    // payload byte by byte.
    let payload: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    let mut large = Vec::new();
    encode::bulk(&mut large, &payload);
    g.throughput(Throughput::Bytes(large.len() as u64));
    g.bench_function("bulk_64KiB", |b| {
        b.iter(|| {
            let (reply, used) = decode(black_box(&large), &limits).unwrap().unwrap();
            assert_eq!(used, large.len());
            let Reply::Bulk(Some(body)) = reply else {
                panic!("not a bulk string: {reply:?}")
            };
            assert_eq!(body.len(), payload.len());
            black_box(body);
        })
    });
    // The same bulk string arriving in 16 KiB reads (the driver's first inbox size): the
    // parser restarts from the header on every call, one call per read.
    g.bench_function("bulk_64KiB/in_16KiB_reads", |b| {
        b.iter(|| {
            let whole: &[u8] = black_box(&large);
            let mut have = 0;
            loop {
                have = (have + 16 * 1024).min(whole.len());
                match decode(&whole[..have], &limits).unwrap() {
                    Some((Reply::Bulk(Some(body)), used)) => {
                        assert_eq!((used, body.len()), (whole.len(), payload.len()));
                        break;
                    }
                    Some((other, _)) => panic!("unexpected {other:?}"),
                    None => assert!(have < whole.len()),
                }
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench_encode, bench_decode_small);
criterion_main!(benches);
