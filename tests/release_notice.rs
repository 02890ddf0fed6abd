//! The release notice against real redis-server processes (issue #11): every release that
//! deletes a key publishes an empty message on `quorumlock:released:<key>` on that node;
//! one that deletes nothing publishes nothing.
//!
//! Each test listens with a plain RESP connection (the test's own `Admin`, not the
//! library) subscribed on every node. "Nothing was published" is shown without waiting
//! for an absence: after the release that must stay silent, the test publishes a sentinel
//! on the same channel, and the next message the subscriber reads must be the sentinel
//! (a node delivers one subscriber's messages in the order it ran the publishes).
//!
//! The last tests drive the library's own subscriber state machine
//! (`core::notice::Subscriber`) over a plain `TcpStream`, so its reading of a real
//! server's replies (AUTH, confirmations, pushes, PING in subscribed mode) is checked too.

mod common;

use common::admin::{Admin, Reply};
use common::{Cluster, NodeOptions, wait_until};
use quorumlock::__private::core::notice::Subscriber;
use quorumlock::__private::core::script::{RELEASE, RELEASE_ALL, RELEASE_FENCED, RELEASED_PREFIX};
use quorumlock::__private::core::session::Login;
use quorumlock::{Limits, NodeError, Redlock};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long any one expected message may take on a loaded machine: a bound, not a sleep.
const DEADLINE: Duration = Duration::from_secs(10);

fn channel(key: &[u8]) -> Vec<u8> {
    [RELEASED_PREFIX, key].concat()
}

/// A connection to node `i` subscribed to the release channels of `keys`.
fn subscriber(cluster: &Cluster, i: usize, keys: &[&[u8]]) -> Admin {
    let mut sub = cluster.node(i).admin();
    sub.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut args = vec![b"SUBSCRIBE".to_vec()];
    args.extend(keys.iter().map(|k| channel(k)));
    sub.send(&args).unwrap();
    for (n, key) in keys.iter().enumerate() {
        let want = Reply::Array(Some(vec![
            Reply::Bulk(Some(b"subscribe".to_vec())),
            Reply::Bulk(Some(channel(key))),
            Reply::Int(n as i64 + 1),
        ]));
        assert_eq!(sub.recv().unwrap(), want);
    }
    sub
}

/// The next message the subscriber reads: its channel and payload (within the deadline).
fn next_message(sub: &mut Admin) -> (Vec<u8>, Vec<u8>) {
    match sub.recv().expect("a message within the deadline") {
        Reply::Array(Some(v)) => match &v[..] {
            [
                Reply::Bulk(Some(kind)),
                Reply::Bulk(Some(ch)),
                Reply::Bulk(Some(payload)),
            ] if kind == b"message" => (ch.clone(), payload.clone()),
            other => panic!("not a message: {other:?}"),
        },
        other => panic!("not a message: {other:?}"),
    }
}

fn client(cluster: &Cluster, fencing: bool) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_secs(2))
        .retry_count(0)
        .fencing(fencing)
        .build()
        .expect("valid settings")
}

/// Waits (bounded) until every node holds `key` with `token`, so the release deletes it
/// everywhere (a call returns at a majority; the last nodes may lag a moment).
fn wait_held(cluster: &Cluster, key: &[u8], token: &[u8]) {
    assert!(
        wait_until(DEADLINE, || (0..cluster.len()).all(|i| cluster
            .node(i)
            .admin()
            .get(key)
            .as_deref()
            == Some(token))),
        "{key:?} not held everywhere"
    );
}

#[test]
fn unlock_publishes_an_empty_notice_for_the_key_on_every_node() {
    let cluster = Cluster::start(3);
    let key: &[u8] = b"notice:unlock";
    let mut subs: Vec<Admin> = (0..3).map(|i| subscriber(&cluster, i, &[key])).collect();
    let mut rl = client(&cluster, false);
    let lock = rl.try_lock(key, Duration::from_secs(10)).unwrap();
    wait_held(&cluster, key, lock.token());
    assert!(rl.unlock(&lock).unwrap() >= 2);
    for sub in &mut subs {
        // The unlock's deletes that were not waited for still arrive: each node deleted
        // the key and published, within the deadline.
        assert_eq!(next_message(sub), (channel(key), Vec::new()));
    }
}

#[test]
fn lock_all_and_fenced_unlocks_publish_each_key() {
    let cluster = Cluster::start(3);
    let keys: [&[u8]; 2] = [b"notice:a", b"notice:b"];
    for fencing in [false, true] {
        let mut subs: Vec<Admin> = (0..3).map(|i| subscriber(&cluster, i, &keys)).collect();
        let mut rl = client(&cluster, fencing);
        let lock = rl.lock_all(&keys, Duration::from_secs(10)).unwrap();
        for key in keys {
            wait_held(&cluster, key, lock.token());
        }
        rl.unlock(&lock).unwrap();
        for sub in &mut subs {
            // The script publishes in key order.
            assert_eq!(next_message(sub).0, channel(keys[0]), "fencing {fencing}");
            assert_eq!(next_message(sub).0, channel(keys[1]), "fencing {fencing}");
        }
    }
}

#[test]
fn a_release_that_deletes_nothing_publishes_nothing() {
    let cluster = Cluster::start(1);
    let key: &[u8] = b"notice:other";
    let fence = quorumlock::__private::core::slot::fence_key(key);
    let mut sub = subscriber(&cluster, 0, &[key]);
    let mut admin = cluster.node(0).admin();
    admin.set(key, "their-token");
    let one = b"1".as_slice();
    let two = b"2".as_slice();
    let attempts: [Vec<&[u8]>; 4] = [
        // Someone else's token, by each release script.
        vec![b"EVAL", RELEASE, one, key, b"our-token"],
        vec![b"EVAL", RELEASE_ALL, one, key, b"our-token"],
        vec![
            b"EVAL",
            RELEASE_FENCED,
            two,
            key,
            &fence,
            b"our-token",
            b"5",
        ],
        // No key at all.
        vec![b"EVAL", RELEASE, one, b"notice:missing", b"our-token"],
    ];
    for args in &attempts {
        assert_eq!(admin.cmd(args), Reply::Int(0), "{args:?}");
    }
    assert_eq!(admin.get(key).as_deref(), Some(&b"their-token"[..]));
    // Had any of them published, its message would come before this one.
    let publish: [&[u8]; 3] = [b"PUBLISH", &channel(key), b"sentinel"];
    assert_eq!(admin.cmd(&publish), Reply::Int(1));
    assert_eq!(next_message(&mut sub), (channel(key), b"sentinel".to_vec()));
    // And the right token does publish (the same connection, so the order is the same).
    let args: [&[u8]; 5] = [b"EVAL", RELEASE, one, key, b"their-token"];
    assert_eq!(admin.cmd(&args), Reply::Int(1));
    assert_eq!(next_message(&mut sub), (channel(key), Vec::new()));
}

/// A `Subscriber` on its own socket, driven as the loop will drive it (blocking here).
struct Wire {
    sub: Subscriber,
    stream: TcpStream,
}

impl Wire {
    fn open(cluster: &Cluster, i: usize, password: Option<&str>) -> Wire {
        let login = Login {
            password: password.map(String::from),
            ..Login::default()
        };
        let mut sub = Subscriber::new(&login, Limits::default());
        let stream = TcpStream::connect(cluster.node(i).addr().unwrap()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        sub.opened();
        Wire { sub, stream }
    }

    fn flush(&mut self) {
        let out = self.sub.outbox().to_vec();
        self.stream.write_all(&out).unwrap();
        self.sub.consumed(out.len());
    }

    /// Writes what is queued, then reads until a notice arrives, nothing is owed any more
    /// (`None`), or the deadline passes (a panic).
    fn next(&mut self) -> Result<Option<Vec<u8>>, NodeError> {
        self.flush();
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(n) = self.sub.next_notice()? {
                return Ok(Some(n.key.to_vec()));
            }
            if !self.sub.owes() {
                return Ok(None);
            }
            assert!(Instant::now() < deadline, "no reply within {DEADLINE:?}");
            let room = self.sub.read_room()?;
            match self.stream.read(room) {
                Ok(0) => return Err(NodeError::Closed),
                Ok(n) => self.sub.received(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads until a notice arrives (within the deadline), answering nothing else.
    fn notice(&mut self) -> Vec<u8> {
        // A PING keeps a reply owed, so `next` waits for the notice rather than
        // returning once the confirmations are in; its answer is consumed on the way.
        let deadline = Instant::now() + DEADLINE;
        loop {
            assert!(Instant::now() < deadline, "no notice within {DEADLINE:?}");
            self.sub.ping();
            if let Some(key) = self.next().unwrap() {
                return key;
            }
        }
    }
}

#[test]
fn the_subscriber_reads_a_real_servers_replies_and_notices() {
    let cluster = Cluster::start_with(1, &NodeOptions::with_password("s3cret"));
    let mut wire = Wire::open(&cluster, 0, Some("s3cret"));
    wire.sub.want(b"live:a").unwrap();
    wire.sub.want(b"live:b").unwrap();
    wire.sub.want(b"live:a").unwrap();
    // AUTH and both confirmations, then a PING in subscribed mode.
    assert_eq!(wire.next(), Ok(None));
    wire.sub.ping();
    assert_eq!(wire.next(), Ok(None));
    let mut rl = client(&cluster, false);
    let lock = rl.try_lock("live:b", Duration::from_secs(10)).unwrap();
    rl.unlock(&lock).unwrap();
    assert_eq!(wire.notice(), b"live:b");
    // One waiter gone: still subscribed. The last gone: unsubscribed (the node confirms
    // it), and a release of `live:a` gives no notice (the next one is `live:b`'s).
    wire.sub.unwant(b"live:a").unwrap();
    assert_eq!(wire.next(), Ok(None));
    let lock = rl.try_lock("live:a", Duration::from_secs(10)).unwrap();
    rl.unlock(&lock).unwrap();
    assert_eq!(wire.notice(), b"live:a");
    wire.sub.unwant(b"live:a").unwrap();
    assert_eq!(wire.next(), Ok(None));
    let lock = rl.try_lock("live:a", Duration::from_secs(10)).unwrap();
    rl.unlock(&lock).unwrap();
    let lock = rl.try_lock("live:b", Duration::from_secs(10)).unwrap();
    rl.unlock(&lock).unwrap();
    assert_eq!(wire.notice(), b"live:b");
    // A reconnect subscribes what is wanted again.
    wire.sub.closed();
    let mut wire2 = Wire::open(&cluster, 0, Some("s3cret"));
    wire2.sub.want(b"live:b").unwrap();
    assert_eq!(wire2.next(), Ok(None));
    let lock = rl.try_lock("live:b", Duration::from_secs(10)).unwrap();
    rl.unlock(&lock).unwrap();
    assert_eq!(wire2.notice(), b"live:b");
}

#[test]
fn the_subscriber_reports_a_refused_auth() {
    let cluster = Cluster::start_with(1, &NodeOptions::with_password("s3cret"));
    let mut wire = Wire::open(&cluster, 0, Some("wrong"));
    wire.sub.want(b"k").unwrap();
    match wire.next() {
        Err(NodeError::Handshake(m)) => assert!(m.starts_with("WRONGPASS"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_user_allowed_no_channel_still_releases() {
    // Redis 7's default for new users: no pub/sub channel at all. The notice fails,
    // quietly; the release must not.
    let cluster = Cluster::start(3);
    let urls: Vec<String> = (0..3)
        .map(|n| {
            let mut admin = cluster.node(n).admin();
            let r = admin.cmd(&[
                "ACL",
                "SETUSER",
                "nochan",
                "on",
                ">pw",
                "~*",
                "resetchannels",
                "+@all",
            ]);
            assert!(r.is_ok(), "ACL SETUSER: {r:?}");
            let port = cluster.node(n).port().expect("tcp node");
            format!("redis://nochan:pw@127.0.0.1:{port}")
        })
        .collect();
    let mut rl = Redlock::builder().nodes(&urls).build().unwrap();
    let lock = rl.lock("notice:nochan", Duration::from_secs(30)).unwrap();
    let released = rl
        .unlock(&lock)
        .expect("the release works without its notice");
    assert!(released >= 2, "released on {released} nodes");
    assert!(wait_until(DEADLINE, || {
        (0..3).all(|n| !cluster.node(n).admin().exists("notice:nochan"))
    }));
    let all = rl
        .lock_all(
            &["notice:nochan:a", "notice:nochan:b"],
            Duration::from_secs(30),
        )
        .unwrap();
    assert!(rl.unlock(&all).unwrap() >= 2);
}
