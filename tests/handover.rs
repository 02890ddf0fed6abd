//! Locks handed across processes (`Lock::to_parts`, `Lock::from_parts`): the process
//! that took a lock hands it over as plain data, and another process, with a client of
//! its own, extends and releases it.

mod common;

use common::Cluster;
use quorumlock::{Error, Lock, LockParts, Redlock};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The environment variable that makes [`handover_receiver`] the second process.
const HANDOVER: &str = "QUORUMLOCK_TEST_HANDOVER";

fn client(urls: &[String]) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .node_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Wall-clock milliseconds: the one clock two processes on one machine share, to
/// measure the parts' time in transit.
fn wall_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// What the parent sends: the nodes, the parts, and when it sent them.
fn encode(urls: &[String], parts: &LockParts) -> String {
    let resources: Vec<String> = parts.resources.iter().map(|r| hex(r)).collect();
    format!(
        "{} {} {} {} {} {} {}",
        urls.join(","),
        resources.join(","),
        hex(&parts.token),
        parts.ttl.as_millis(),
        parts.remaining.as_millis(),
        parts.fence.map_or("-".to_string(), |f| f.to_string()),
        wall_ms()
    )
}

/// The second process, not a test of its own: this test binary run again, by
/// `a_lock_handed_to_another_process_is_extended_and_released_there`, with [`HANDOVER`]
/// set and this test alone. It takes the lock over (less its time in transit), extends
/// it and releases it, and says on how many nodes. In the suite's own run, with nothing
/// handed to it, it returns at once.
#[test]
fn handover_receiver() {
    let Ok(spec) = std::env::var(HANDOVER) else {
        return;
    };
    let f: Vec<&str> = spec.split(' ').collect();
    let urls: Vec<String> = f[0].split(',').map(String::from).collect();
    let sent_at: u128 = f[6].parse().unwrap();
    let transit = Duration::from_millis((wall_ms().saturating_sub(sent_at)) as u64);
    let parts = LockParts {
        resources: f[1].split(',').map(unhex).collect(),
        token: unhex(f[2]),
        ttl: Duration::from_millis(f[3].parse().unwrap()),
        // The receiver's own bound on the validity left: the sender's, less the transit
        // (and a millisecond for the wall clock's rounding).
        remaining: Duration::from_millis(f[4].parse().unwrap())
            .saturating_sub(transit + Duration::from_millis(1)),
        fence: (f[5] != "-").then(|| f[5].parse().unwrap()),
    };
    let mut rl = client(&urls);
    let mut lock = Lock::from_parts(parts).expect("a lock");
    assert!(lock.is_valid());
    rl.extend(&mut lock, Duration::from_secs(30))
        .expect("the receiver extends the lock");
    let released = rl.unlock(&lock).expect("the receiver releases the lock");
    println!("released on {released}");
}

#[test]
fn a_lock_handed_to_another_process_is_extended_and_released_there() {
    let cluster = Cluster::start(3);
    let urls = cluster.urls();
    let mut rl = client(&urls);
    let lock = rl.lock("handover:job", Duration::from_secs(30)).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "handover_receiver",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HANDOVER, encode(&urls, &lock.to_parts()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("released on"), "{stdout}");
    // Released there: no node holds the key, and the sender's own release finds nothing.
    assert!(common::wait_until(Duration::from_secs(10), || {
        (0..3).all(|n| !cluster.node(n).admin().exists("handover:job"))
    }));
    let e = rl.unlock(&lock).expect_err("held nowhere any more");
    assert!(matches!(e, Error::Expired(_)), "{e}");
}

#[test]
fn a_fenced_lock_over_several_resources_survives_the_trip() {
    let cluster = Cluster::start(3);
    let urls = cluster.urls();
    let fenced = |urls: &[String]| {
        Redlock::builder()
            .nodes(urls)
            .node_timeout(Duration::from_secs(1))
            .fencing(true)
            .build()
            .unwrap()
    };
    let mut sender = fenced(&urls);
    let lock = sender
        .lock_all(&["handover:a", "handover:b"], Duration::from_secs(30))
        .unwrap();
    let parts = lock.to_parts();
    assert_eq!(
        parts.resources,
        [b"handover:a".to_vec(), b"handover:b".to_vec()]
    );
    assert_eq!(parts.fence, lock.fence());
    assert!(parts.remaining <= parts.ttl);

    let mut receiver = fenced(&urls);
    let mut taken_over = Lock::from_parts(parts.clone()).unwrap();
    assert_eq!(taken_over.to_parts().resources, parts.resources);
    assert_eq!(taken_over.fence(), lock.fence());
    assert_eq!(taken_over.token(), lock.token());
    assert!(taken_over.remaining() <= parts.remaining);
    receiver
        .extend(&mut taken_over, Duration::from_secs(30))
        .unwrap();
    assert!(receiver.unlock(&taken_over).unwrap() >= 2);
    for key in ["handover:a", "handover:b"] {
        assert!(
            common::wait_until(Duration::from_secs(10), || {
                (0..3).all(|n| !cluster.node(n).admin().exists(key))
            }),
            "{key} left behind"
        );
    }
    // The next holder's fence is still above the handed-over lock's.
    let next = sender.lock("handover:a", Duration::from_secs(30)).unwrap();
    assert!(next.fence() > lock.fence());
}

#[test]
fn parts_that_cannot_be_a_lock_are_refused() {
    let good = LockParts {
        resources: vec![b"r".to_vec()],
        token: b"0123456789abcdef0123456789abcdef".to_vec(),
        ttl: Duration::from_secs(10),
        remaining: Duration::from_secs(5),
        fence: None,
    };
    assert!(Lock::from_parts(good.clone()).is_ok());
    // A caller's own token (`lock_with_token`) travels too, whatever its length.
    for token in [&b"w"[..], b"worker-7", &[0xff; 128]] {
        let parts = LockParts {
            token: token.to_vec(),
            ..good.clone()
        };
        assert_eq!(Lock::from_parts(parts).unwrap().token(), token);
    }
    let cases: Vec<(&str, LockParts)> = vec![
        (
            "resources",
            LockParts {
                resources: vec![],
                ..good.clone()
            },
        ),
        (
            "resource",
            LockParts {
                resources: vec![vec![]],
                ..good.clone()
            },
        ),
        (
            "resources",
            LockParts {
                resources: vec![b"r".to_vec(), b"r".to_vec()],
                ..good.clone()
            },
        ),
        (
            "token",
            LockParts {
                token: vec![],
                ..good.clone()
            },
        ),
        (
            "token",
            LockParts {
                token: vec![b'x'; quorumlock::MAX_TOKEN + 1],
                ..good.clone()
            },
        ),
        (
            "ttl",
            LockParts {
                ttl: Duration::ZERO,
                remaining: Duration::ZERO,
                ..good.clone()
            },
        ),
        (
            "remaining",
            LockParts {
                remaining: Duration::from_secs(11),
                ..good.clone()
            },
        ),
        (
            "fence",
            LockParts {
                fence: Some(0),
                ..good.clone()
            },
        ),
    ];
    for (what, parts) in cases {
        match Lock::from_parts(parts) {
            Err(Error::InvalidArgument(e)) => {
                assert!(e.to_string().contains(what), "{what}: {e}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // The token is a credential: `Debug` shows a prefix only.
    let shown = format!("{good:?}");
    assert!(shown.contains("01234567"), "{shown}");
    assert!(!shown.contains("0123456789abcdef0123"), "{shown}");
}
