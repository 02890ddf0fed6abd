//! No public type shows a whole lock token in `{:?}`, `{:#?}` or `{}`: the token is a
//! credential (whoever has it can extend or release the lock). Each type that holds one
//! is formatted on a real lock on live nodes, and the output searched for the token.

mod common;

use common::Cluster;
use quorumlock::{Error, Lock, Redlock};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

/// Every rendering of `value` that its type implements.
fn debug_forms(value: &impl std::fmt::Debug) -> [String; 2] {
    [format!("{value:?}"), format!("{value:#?}")]
}

/// Asserts that no text in `shown` holds `token` whole, and that some shows its prefix
/// (so the check looks where the token would be).
fn assert_redacted(what: &str, token: &[u8], shown: &[String]) {
    let whole = String::from_utf8(token.to_vec()).expect("random tokens are hex");
    assert_eq!(whole.len(), 32, "a random token is 32 hex digits");
    for text in shown {
        assert!(
            !text.contains(&whole),
            "{what} shows the whole token: {text}"
        );
    }
    assert!(
        shown.iter().any(|t| t.contains(&whole[..8])),
        "{what} shows no prefix of the token (is it formatted at all?): {shown:?}"
    );
}

#[test]
fn no_public_type_shows_a_whole_token() {
    let cluster = Cluster::start(3);
    let mut rl = Redlock::builder().nodes(cluster.urls()).build().unwrap();

    // A direct lock, its parts, and the error of a second client that finds it held.
    let lock: Lock = rl.lock("redaction:direct", TTL).unwrap();
    assert_redacted("Lock", lock.token(), &debug_forms(&lock));
    let parts = lock.to_parts();
    assert_redacted("LockParts", lock.token(), &debug_forms(&parts));
    let mut other = Redlock::builder()
        .nodes(cluster.urls())
        .retry_count(0)
        .build()
        .unwrap();
    let err: Error = other.try_lock("redaction:direct", TTL).expect_err("held");
    let mut shown = debug_forms(&err).to_vec();
    shown.push(err.to_string());
    if let Some(f) = err.failure() {
        shown.extend(debug_forms(f));
        shown.push(f.to_string());
        for n in &f.nodes {
            shown.extend(debug_forms(n));
        }
    }
    for text in &shown {
        let whole = String::from_utf8(lock.token().to_vec()).unwrap();
        assert!(!text.contains(&whole), "the error shows the token: {text}");
    }

    // What `inspect` reads on each node: the holder's token.
    let settings = Redlock::builder().nodes(cluster.urls()).settings().unwrap();
    let views = quorumlock::inspect(&settings, b"redaction:direct");
    let mut shown = Vec::new();
    for v in &views {
        let v = v.as_ref().expect("every node answers");
        assert_eq!(v.value.as_deref(), Some(lock.token()));
        shown.extend(debug_forms(v));
    }
    assert_redacted("NodeView", lock.token(), &shown);
    rl.unlock(&lock).unwrap();

    // A lock of several resources.
    let all = rl.lock_all(&["redaction:a", "redaction:b"], TTL).unwrap();
    assert_redacted("Lock (lock_all)", all.token(), &debug_forms(&all));
    rl.unlock(&all).unwrap();

    // The shared client: its locks, leases, and the lease's lost future.
    let shared = Redlock::builder()
        .nodes(cluster.urls())
        .build_shared()
        .unwrap();
    let lock = shared.blocking_lock("redaction:shared", TTL).unwrap();
    assert_redacted("Lock (shared)", lock.token(), &debug_forms(&lock));
    shared.blocking_unlock(&lock).unwrap();
    let lease = shared.blocking_lease("redaction:lease", TTL).unwrap();
    let mut shown = debug_forms(&lease).to_vec();
    shown.extend(debug_forms(&lease.lost()));
    let signal = lease.lost_signal();
    shown.extend(debug_forms(&signal));
    shown.extend(debug_forms(&signal.before(Duration::from_secs(1))));
    shown.extend(debug_forms(&signal.lost()));
    shown.extend(debug_forms(&shared));
    assert_redacted("Lease", lease.token(), &shown);
    lease.blocking_release().unwrap();
}
