//! Locks under a value the caller chose (`lock_with_token`, redsync's `WithValue`), against
//! real `redis-server` nodes: the value is what the nodes store, extend and unlock compare
//! against it, any bytes of any allowed length travel intact, and what cannot be a token
//! is refused before anything is sent.

mod common;

use common::{Cluster, wait_until};
use quorumlock::{Error, MAX_TOKEN, Redlock};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

fn client(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_secs(1))
        .retry_count(0)
        .build()
        .expect("valid configuration")
}

/// How many nodes hold `value` under `key`.
fn holding(cluster: &Cluster, nodes: usize, key: &str, value: &[u8]) -> usize {
    (0..nodes)
        .filter(|&n| cluster.node(n).admin().get(key).as_deref() == Some(value))
        .count()
}

fn nobody_holds(cluster: &Cluster, nodes: usize, key: &str) -> bool {
    wait_until(Duration::from_secs(10), || {
        (0..nodes).all(|n| !cluster.node(n).admin().exists(key))
    })
}

#[test]
fn a_named_holder_locks_extends_and_unlocks_under_its_own_name() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster);
    let name = b"host-3:pid-812:job-42";
    let mut lock = rl
        .lock_with_token("named:a", TTL, name)
        .expect("a free resource");
    assert_eq!(lock.token(), name);
    assert!(holding(&cluster, 3, "named:a", name) >= 2);

    // Another holder, named or not, is refused while it is held.
    let mut other = client(&cluster);
    assert!(matches!(
        other.try_lock_with_token("named:a", TTL, "someone-else"),
        Err(Error::Taken(_))
    ));
    assert!(matches!(
        other.try_lock("named:a", TTL),
        Err(Error::Taken(_))
    ));

    rl.extend(&mut lock, Duration::from_secs(60))
        .expect("extend");
    let pttl = cluster.node(0).admin().pttl("named:a");
    assert!(pttl > 30_000, "pttl {pttl} after extending to 60 s");

    assert!(rl.unlock(&lock).expect("unlock") >= 2);
    assert!(nobody_holds(&cluster, 3, "named:a"));
}

#[test]
fn any_bytes_of_any_allowed_length_travel_intact() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster);
    // Lengths around the inline 32 bytes and at the bounds; bytes that RESP must carry
    // as they are (CR, LF, NUL, `$`, non-ASCII).
    let mut tokens: Vec<Vec<u8>> = [1, 2, 9, 10, 31, 32, 33, 99, 100, MAX_TOKEN]
        .iter()
        .map(|&n| (0..n).map(|i| (i * 37 + 11) as u8).collect())
        .collect();
    tokens.push(b"\r\n$5\r\nhello\r\n".to_vec());
    tokens.push(vec![0; 32]);
    for (i, token) in tokens.iter().enumerate() {
        let key = format!("bytes:{i}");
        let lock = rl.try_lock_with_token(&key, TTL, token).expect("free");
        assert_eq!(lock.token(), &token[..]);
        assert!(
            holding(&cluster, 3, &key, token) >= 2,
            "token of {} bytes",
            token.len()
        );
        // `Debug` never shows the whole value (it is a credential), and does not trip on
        // short or non-UTF-8 ones.
        let shown = format!("{lock:?}");
        assert!(shown.contains("token"), "{shown}");
        assert!(rl.unlock(&lock).expect("unlock") >= 2);
        assert!(
            nobody_holds(&cluster, 3, &key),
            "token of {} bytes",
            token.len()
        );
    }
}

#[test]
fn an_unlock_with_another_value_leaves_the_named_lock_alone() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster);
    let lock = rl.try_lock_with_token("named:b", TTL, "alice").unwrap();
    // A lock with the same resource and another name, as a stale or foreign holder
    // would have, handed in as plain data.
    let mut parts = lock.to_parts();
    parts.token = b"mallory".to_vec();
    let impostor = quorumlock::Lock::from_parts(parts).unwrap();
    assert!(
        rl.unlock(&impostor).is_err(),
        "no node holds the impostor's token"
    );
    assert_eq!(holding(&cluster, 3, "named:b", b"alice"), 3);
    rl.unlock(&lock).unwrap();
    assert!(nobody_holds(&cluster, 3, "named:b"));
}

#[test]
fn what_cannot_be_a_token_is_refused_before_anything_is_sent() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster);
    let too_long = vec![b'x'; MAX_TOKEN + 1];
    for bad in [&b""[..], &too_long] {
        for result in [
            rl.try_lock_with_token("refused", TTL, bad),
            rl.lock_with_token("refused", TTL, bad),
        ] {
            match result {
                Err(Error::InvalidArgument(e)) => {
                    let text = e.to_string();
                    assert!(text.contains("token"), "{text}");
                    // The length, never the value.
                    assert!(!text.contains("xxxx"), "{text}");
                }
                other => panic!("{} bytes: {other:?}", bad.len()),
            }
        }
    }
    assert!((0..3).all(|n| !cluster.node(n).admin().exists("refused")));
}

#[test]
fn the_shared_client_takes_named_and_drawn_tokens_in_one_batch() {
    let cluster = Cluster::start(3);
    let shared = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_secs(1))
        .retry_count(0)
        .build_shared()
        .expect("valid configuration");
    // Many threads at once, so that the loop runs named and drawn acquires in the same
    // rounds; every lock must carry exactly the value it was asked for.
    std::thread::scope(|s| {
        for t in 0..8 {
            let shared = &shared;
            s.spawn(move || {
                for i in 0..20 {
                    let key = format!("shared:{t}:{i}");
                    if (t + i) % 2 == 0 {
                        let name = format!("worker-{t}-{i}");
                        let lock = shared
                            .blocking_try_lock_with_token(&key, TTL, &name)
                            .expect("free");
                        assert_eq!(lock.token(), name.as_bytes());
                        shared.blocking_unlock(&lock).expect("unlock");
                    } else {
                        let lock = shared.blocking_try_lock(&key, TTL).expect("free");
                        assert_eq!(lock.token().len(), 32);
                        shared.blocking_unlock(&lock).expect("unlock");
                    }
                }
            });
        }
    });
    let named = shared
        .blocking_lock_with_token("shared:named", TTL, "one-name")
        .unwrap();
    assert_eq!(holding(&cluster, 3, "shared:named", b"one-name"), 3);
    assert!(matches!(
        shared.blocking_try_lock_with_token("shared:named", TTL, ""),
        Err(Error::InvalidArgument(_))
    ));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert!(matches!(
            shared.try_lock_with_token("shared:named", TTL, "two").await,
            Err(Error::Taken(_))
        ));
        let lock = shared
            .lock_with_token("shared:async", TTL, "async-holder")
            .await
            .unwrap();
        assert_eq!(lock.token(), b"async-holder");
        shared.unlock(&lock).await.unwrap();
    });
    shared.blocking_unlock(&named).unwrap();
    assert!(nobody_holds(&cluster, 3, "shared:named"));
    assert!(nobody_holds(&cluster, 3, "shared:async"));
}
