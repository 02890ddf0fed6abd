//! Scenarios for what `docs/GUARANTEES.md` promises: each starts real `redis-server`
//! nodes, injects one fault (SIGSTOP/SIGCONT, SIGKILL + restart, a delaying proxy, a
//! misbehaving fake node) and asserts the outcome.
//!
//! - [`unsafe_restart_gives_two_holders_and_the_checker_sees_it`]: the danger
//!   `docs/GUARANTEES.md` describes (a node restarted at once without persistence)
//!   really yields two holders, and the overlap checker the torture test uses reports it.
//! - The same restart with the restart guard on gives no second holder
//!   ([`the_restart_guard_keeps_a_restarted_node_from_granting_a_second_holder`]).
//! - A TCP proxy in front of node 0, listed as a sixth node, never adds a vote, for
//!   acquire and extend ([`an_alias_of_a_node_never_votes_twice`]).
//! - [`failed_extend_never_moves_the_deadline_later`] and
//!   [`failed_shorter_extend_moves_the_deadline_to_its_own_ttl`].
//! - [`elapsed_counts_from_before_the_first_write`].
//! - [`quorum_after_the_validity_is_gone_is_expired_and_cleaned_up`].
//! - [`reply_nobody_asked_for_during_a_round_resets_the_connection`] and
//!   [`reply_nobody_asked_for_between_rounds_is_never_a_vote`]: what RESP2 lets a client
//!   detect; [`reply_in_place_of_another_is_caught_one_reply_later`]: what it does not,
//!   and how the stream is put back in step afterwards.
//!
//! Nothing here waits by sleeping: conditions are polled with a deadline, and ttls are
//! long enough that no outcome depends on how fast a loaded machine runs.

mod common;

use common::checker::{Clock, check, hold_line, mono_ns};
use common::{Cluster, Mode, Proxy, wait_until};
use quorumlock::{Error, Lock, NodeError, Outcome, Phase, Redlock};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// A ttl no scenario can outlive by accident on a loaded machine.
const LONG_TTL: Duration = Duration::from_secs(30);
/// Bound on every poll for a condition.
const WAIT: Duration = Duration::from_secs(10);

fn client(urls: &[String], node_timeout: Duration, retries: u32) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .node_timeout(node_timeout)
        .retry_count(retries)
        .retry_delay(Duration::from_millis(50))
        .retry_jitter(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(50))
        .build()
        .expect("valid configuration")
}

/// Takes and releases a throwaway lock until both succeed, so the connections of `rl`
/// are established before a scenario starts.
fn warm_up(rl: &mut Redlock, key: &str) {
    warm_up_within(rl, key, WAIT);
}

/// [`warm_up`], trying for up to `within`: a client with the restart guard on writes its
/// marker on its first handshake with each node, and a node whose marker it had to write
/// counts as new for the whole guard (the first use of a fresh deployment waits it out).
fn warm_up_within(rl: &mut Redlock, key: &str, within: Duration) {
    let mut last = None;
    let ok = wait_until(within, || match rl.try_lock(key, LONG_TTL) {
        Ok(lock) => match rl.unlock(&lock) {
            Ok(_) => true,
            Err(e) => {
                last = Some(e);
                false
            }
        },
        Err(e) => {
            last = Some(e);
            false
        }
    });
    assert!(ok, "warm-up lock on every node failed: {last:?}");
}

/// The value of `key` on node `i` (`None` if absent).
fn get(cluster: &Cluster, i: usize, key: &str) -> Option<Vec<u8>> {
    cluster.node(i).admin().get(key)
}

// ---------------------------------------------------------------------------------------
// 1. The unsafe restart

/// A lock held on exactly 3 of 5 nodes (the other 2 frozen during the acquire), one of the
/// 3 killed and restarted at once with no persistence, the 2 thawed: a second client wins
/// a majority while the first is still valid. This is the danger the "delayed restart"
/// rule (`docs/GUARANTEES.md`; the README's "Operating rules") prevents; the checker must
/// report the two overlapping windows.
#[test]
fn unsafe_restart_gives_two_holders_and_the_checker_sees_it() {
    const KEY: &str = "scenario:unsafe-restart";
    let cluster = Cluster::start(5);
    let urls = cluster.urls();
    let node_timeout = Duration::from_millis(500);
    let mut a = client(&urls, node_timeout, 5);
    let mut b = client(&urls, node_timeout, 10);
    warm_up(&mut a, "scenario:warm-a");
    warm_up(&mut b, "scenario:warm-b");
    let clock = Clock::calibrate();

    let (lock_a, call_a, acq_a) =
        hold_on_three_then_restart_one(&cluster, &mut a, node_timeout, KEY);

    // B wins nodes 2, 3, 4: a majority, while A's lock is still valid.
    let call_b = mono_ns();
    let lock_b = b
        .lock(KEY, LONG_TTL)
        .expect("B wins the fresh node and the two that never had A's key");
    let acq_b = mono_ns();
    assert!(
        lock_a.is_valid(),
        "A's 30 s lock must still be valid when B wins"
    );
    for i in 2..5 {
        assert_eq!(get(&cluster, i, KEY).as_deref(), Some(lock_b.token()));
    }

    // The torture checker sees two holders at once.
    let logs = vec![
        (
            "a".to_string(),
            hold_line(
                0,
                0,
                1,
                call_a,
                clock.map(lock_a.started()),
                acq_a,
                clock.map(lock_a.deadline()),
                u64::MAX,
                false,
            ),
        ),
        (
            "b".to_string(),
            hold_line(
                1,
                0,
                1,
                call_b,
                clock.map(lock_b.started()),
                acq_b,
                clock.map(lock_b.deadline()),
                u64::MAX,
                false,
            ),
        ),
    ];
    let report = check(&logs, 0);
    assert_eq!(report.holds, 2);
    assert_eq!(report.overlaps, 1, "{:?}", report.violations);
    assert!(
        report.violations.iter().any(|v| v.starts_with("overlap")),
        "{:?}",
        report.violations
    );
}

/// The same restart with the restart guard on in the second client: the restarted node
/// has been up for less than the guard, so its yes does not count, and B cannot win while
/// A holds the lock on nodes 0 and 1. Once A unlocks, B wins on the four other nodes, still
/// without the young node's vote.
#[test]
fn the_restart_guard_keeps_a_restarted_node_from_granting_a_second_holder() {
    const KEY: &str = "scenario:guarded-restart";
    // Longer than the time from the restart to B's last attempt, however loaded the
    // machine; the nodes must have been up this long before the scenario starts.
    const GUARD: Duration = Duration::from_secs(10);
    let cluster = Cluster::start(5);
    let urls = cluster.urls();
    let node_timeout = Duration::from_millis(500);
    let mut a = client(&urls, node_timeout, 5);
    let mut b = Redlock::builder()
        .nodes(&urls)
        .node_timeout(node_timeout)
        // About a second of attempts: its reconnect to the restarted node is done well
        // before the last one, whose report the error carries.
        .retry_count(10)
        .retry_delay(Duration::from_millis(100))
        .retry_jitter(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(50))
        .restart_guard(GUARD)
        .build()
        .expect("valid configuration");
    // Every node must be older than the guard, or B could lock nothing at all.
    let uptime = |i: usize| cluster.node(i).admin().uptime_secs();
    assert!(
        wait_until(GUARD * 3, || (0..5).all(|i| uptime(i) > GUARD.as_secs())),
        "the nodes never got older than the guard"
    );
    warm_up(&mut a, "scenario:warm-a");
    warm_up_within(&mut b, "scenario:warm-b", GUARD + WAIT);

    let (lock_a, _, _) = hold_on_three_then_restart_one(&cluster, &mut a, node_timeout, KEY);
    let restarted_at = Instant::now();

    let err = b
        .lock(KEY, LONG_TTL)
        .expect_err("the restarted node's yes must not give B a majority");
    assert!(
        restarted_at.elapsed() < GUARD,
        "B's attempts outlasted the guard; the scenario says nothing"
    );
    let Error::Unavailable(failure) = &err else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert!(
        matches!(
            failure.nodes[2].outcome,
            Outcome::Failed(NodeError::YoungerThanGuard { .. })
        ),
        "node 2 must be reported held back by the guard: {err}"
    );
    assert!(err.to_string().contains("restart_guard"), "{err}");
    assert!(lock_a.is_valid());
    // B's attempts set nothing that outlives them: A's key is still A's on 0 and 1.
    for i in 0..2 {
        assert_eq!(get(&cluster, i, KEY).as_deref(), Some(lock_a.token()));
    }

    // A unlocks: nodes 0, 1, 3, 4 are a majority without the young node.
    a.unlock(&lock_a).expect("unlock");
    let lock_b = b.lock(KEY, LONG_TTL).expect("B wins once A is gone");
    for i in [0, 1, 3, 4] {
        assert_eq!(get(&cluster, i, KEY).as_deref(), Some(lock_b.token()));
    }
    b.unlock(&lock_b).expect("unlock");
}

/// Node 0 is listed twice: once directly, once as a "sixth node" behind a TCP proxy (as a
/// DNS alias or a port forward would). Six endpoints need 4 votes; with nodes 3 and 4
/// frozen only 3 servers can vote, and the alias must not make them 4, for an acquire
/// and for an extend. Its report names the node it duplicates.
#[test]
fn an_alias_of_a_node_never_votes_twice() {
    let cluster = Cluster::start(5);
    let proxy = Proxy::start(cluster.node(0).addr().expect("tcp"));
    let mut urls = cluster.urls();
    urls.push(proxy.url());
    let mut rl = client(&urls, Duration::from_millis(500), 0);
    warm_up(&mut rl, "scenario:warm-alias");
    let is_duplicate_of_node_0 = |e: &Error| {
        let (Error::Unavailable(f) | Error::Taken(f) | Error::Expired(f)) = e else {
            return false;
        };
        matches!(
            &f.nodes[5].outcome,
            Outcome::Failed(NodeError::Duplicate { of: 0, endpoint }) if *endpoint == cluster.url(0)
        ) && e.to_string().contains("same server")
    };

    // All five servers up: 5 votes of 6 endpoints, the alias's not among them.
    let mut lock = rl
        .lock("scenario:alias", LONG_TTL)
        .expect("5 servers of 6 endpoints");
    for i in [3, 4] {
        cluster.node(i).freeze();
    }
    let err = rl
        .extend(&mut lock, LONG_TTL)
        .expect_err("3 servers are not 4 votes, alias or not");
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert!(is_duplicate_of_node_0(&err), "{err}");

    let err = rl
        .try_lock("scenario:alias-2", LONG_TTL)
        .expect_err("3 servers are not 4 votes, alias or not");
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert!(is_duplicate_of_node_0(&err), "{err}");
    // The alias's SET went through to node 0: the failed attempt deleted it again.
    assert!(wait_until(WAIT, || get(&cluster, 0, "scenario:alias-2").is_none()));
    for i in [3, 4] {
        cluster.node(i).thaw();
    }
}

/// The unsafe restart's setup: with nodes 3 and 4 frozen (and seen lagging by `a`), `a`
/// locks `key` on nodes 0, 1, 2 only; node 2 then restarts at once, empty, and 3 and 4
/// thaw. Returns the lock and the monotonic times just before and after its `lock` call.
fn hold_on_three_then_restart_one(
    cluster: &Cluster,
    a: &mut Redlock,
    node_timeout: Duration,
    key: &str,
) -> (Lock, u64, u64) {
    // Freeze nodes 3 and 4, and make A see them lagging: a command on another key is
    // queued to them (they owe its reply), and once that reply is older than
    // `node_timeout`, A sends them nothing new.
    cluster.node(3).freeze();
    cluster.node(4).freeze();
    let warm = a
        .lock("scenario:make-lag", LONG_TTL)
        .expect("3 healthy nodes of 5 grant a lock");
    // The SETs queued to the frozen nodes were written before `lock` returned.
    let queued_by = Instant::now();
    assert!(wait_until(WAIT, || queued_by.elapsed() > node_timeout * 2));

    // A's SET on the target key goes only to nodes 0, 1, 2.
    let call_a = mono_ns();
    let lock_a = a
        .lock(key, LONG_TTL)
        .expect("A wins on the 3 healthy nodes");
    let acq_a = mono_ns();
    for i in 0..3 {
        assert_eq!(
            get(cluster, i, key).as_deref(),
            Some(lock_a.token()),
            "node {i} must hold A's token"
        );
    }

    // Node 2 crashes and comes back at once, empty; the frozen nodes wake up.
    cluster.node(2).restart();
    cluster.node(3).thaw();
    cluster.node(4).thaw();
    // The frozen nodes now apply what was queued to them (the other key only).
    assert!(wait_until(WAIT, || {
        get(cluster, 3, "scenario:make-lag").as_deref() == Some(warm.token())
            && get(cluster, 4, "scenario:make-lag").as_deref() == Some(warm.token())
    }));
    let holders: Vec<usize> = (0..5)
        .filter(|&i| get(cluster, i, key).as_deref() == Some(lock_a.token()))
        .collect();
    assert_eq!(
        holders,
        vec![0, 1],
        "after the restart only nodes 0 and 1 may still hold A's token (exactly 3 held \
         it before: 0, 1, 2)"
    );

    (lock_a, call_a, acq_a)
}

// ---------------------------------------------------------------------------------------
// 2. A failed extend only moves the deadline earlier

#[test]
fn failed_extend_never_moves_the_deadline_later() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls(), Duration::from_millis(500), 5);
    warm_up(&mut rl, "scenario:warm");
    let mut lock = rl.lock("scenario:extend-fails", LONG_TTL).expect("lock");
    let before = lock.deadline();
    for i in 0..3 {
        cluster.node(i).freeze();
    }
    let err = rl
        .extend(&mut lock, LONG_TTL)
        .expect_err("an extend that only 2 of 5 nodes answer must fail");
    assert!(
        matches!(err, Error::Unavailable(_) | Error::Expired(_)),
        "{err:?}"
    );
    assert!(
        lock.deadline() <= before,
        "a failed extend moved the deadline later by {:?}",
        lock.deadline() - before
    );
    assert!(lock.is_valid(), "the original lock still has ~30 s");
    for i in 0..3 {
        cluster.node(i).thaw();
    }
}

#[test]
fn failed_shorter_extend_moves_the_deadline_to_its_own_ttl() {
    const KEY: &str = "scenario:extend-shorter";
    let cluster = Cluster::start(5);
    let drift_factor = 0.01;
    let mut rl = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .retry_count(5)
        .drift_factor(drift_factor)
        .build()
        .expect("valid configuration");
    warm_up(&mut rl, "scenario:warm");
    let mut lock = rl.lock(KEY, LONG_TTL).expect("lock");
    let before = lock.deadline();
    for i in 0..3 {
        cluster.node(i).freeze();
    }
    // Nodes 3 and 4 apply the shorter ttl; the frozen 3 never answer: the extend fails,
    // and our key may now vanish from nodes 3 and 4 after 10 s.
    let short = Duration::from_secs(10);
    let err = rl
        .extend(&mut lock, short)
        .expect_err("an extend that only 2 of 5 nodes answer must fail");
    let returned = Instant::now();
    assert!(
        matches!(err, Error::Unavailable(_) | Error::Expired(_)),
        "{err:?}"
    );
    for i in 3..5 {
        let pttl = cluster.node(i).admin().pttl(KEY);
        assert!(
            (0..=short.as_millis() as i64).contains(&pttl),
            "node {i} should have applied the 10 s extend, PTTL {pttl}"
        );
    }
    // The extend started before `returned`: its deadline is at most
    // returned + ttl − drift, with drift ≥ drift_factor × ttl.
    let min_drift = short.mul_f64(drift_factor);
    let bound = returned + short - min_drift;
    assert!(
        lock.deadline() <= bound,
        "after a failed 10 s extend the deadline is {:?} past the bound (returned + ttl − \
         drift)",
        lock.deadline() - bound
    );
    assert!(lock.deadline() < before);
    for i in 0..3 {
        cluster.node(i).thaw();
    }
}

// ---------------------------------------------------------------------------------------
// 3. Elapsed counts from before the first write

/// Chunks a [`Tap`] received from the client, with the instant each arrived.
type Seen = Mutex<Vec<(Instant, Vec<u8>)>>;

/// A pass-through TCP relay that stamps every chunk the client sends, so a test can tell
/// when a command first left the client. Stops its threads on drop.
struct Tap {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    seen: Arc<Seen>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    acceptor: Option<JoinHandle<()>>,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Copies `src` to `dst` until EOF, error or stop; stamps each chunk into `seen`.
fn relay(mut src: TcpStream, mut dst: TcpStream, stop: &AtomicBool, seen: Option<&Seen>) {
    let _ = src.set_read_timeout(Some(Duration::from_millis(10)));
    let mut buf = vec![0u8; 16 * 1024];
    while !stop.load(Ordering::SeqCst) {
        match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let at = Instant::now();
                if let Some(seen) = seen {
                    guard(seen).push((at, buf[..n].to_vec()));
                }
                if dst.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if is_timeout(&e) => {}
            Err(_) => break,
        }
    }
    let _ = src.shutdown(Shutdown::Both);
    let _ = dst.shutdown(Shutdown::Both);
}

impl Tap {
    fn start(target: SocketAddr) -> Tap {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind tap");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("local_addr");
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let threads: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::new(Mutex::new(Vec::new()));
        let (st, se, th) = (stop.clone(), seen.clone(), threads.clone());
        let acceptor = thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    thread::sleep(Duration::from_millis(2));
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let _ = client.set_nodelay(true);
                let Ok(upstream) = TcpStream::connect(target) else {
                    continue;
                };
                let _ = upstream.set_nodelay(true);
                let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) else {
                    continue;
                };
                let (st1, se1, st2) = (st.clone(), se.clone(), st.clone());
                let mut t = guard(&th);
                t.push(thread::spawn(move || {
                    relay(client, upstream, &st1, Some(&se1))
                }));
                t.push(thread::spawn(move || relay(u2, c2, &st2, None)));
            }
        });
        Tap {
            addr,
            stop,
            seen,
            threads,
            acceptor: Some(acceptor),
        }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// When the first chunk containing `needle` arrived from the client.
    fn first_seen(&self, needle: &[u8]) -> Option<Instant> {
        guard(&self.seen)
            .iter()
            .find(|(_, b)| b.windows(needle.len()).any(|w| w == needle))
            .map(|(t, _)| *t)
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let threads: Vec<_> = guard(&self.threads).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

/// Every node behind a delaying proxy (client → tap → proxy → redis): the lock's start is
/// no later than the first byte of its SET reaching any tap (one CLOCK_MONOTONIC in one
/// process), and the validity it returns with has paid for the injected delay.
#[test]
fn elapsed_counts_from_before_the_first_write() {
    const KEY: &str = "scenario:elapsed";
    let ttl = Duration::from_secs(10);
    let delay = Duration::from_millis(200);
    let cluster = Cluster::start(3);
    let proxies: Vec<Proxy> = (0..3)
        .map(|i| Proxy::start(cluster.node(i).addr().expect("tcp node")))
        .collect();
    let taps: Vec<Tap> = proxies.iter().map(|p| Tap::start(p.addr())).collect();
    let urls: Vec<String> = taps.iter().map(Tap::url).collect();
    // node_timeout well above the round trip (2 × delay) through the proxy.
    let mut rl = client(&urls, Duration::from_secs(3), 0);
    warm_up(&mut rl, "scenario:warm");
    for p in &proxies {
        p.set_mode(Mode::Delay(delay));
    }
    let lock = rl
        .try_lock(KEY, ttl)
        .expect("a slow but healthy cluster grants");
    let returned = Instant::now();
    let first_write = taps
        .iter()
        .filter_map(|t| t.first_seen(KEY.as_bytes()))
        .min()
        .expect("the SET went through the taps");
    assert!(
        lock.started() <= first_write,
        "the lock's start is {:?} after its SET reached a node",
        lock.started() - first_write
    );
    let validity = lock.deadline().saturating_duration_since(returned);
    assert!(
        validity <= ttl - delay,
        "validity {validity:?} at return, but each reply took at least {delay:?} \
         (ttl {ttl:?})"
    );
    assert!(lock.is_valid() || validity.is_zero());
}

// ---------------------------------------------------------------------------------------
// 4. A quorum reached after the validity is gone

/// `INFO commandstats` calls of `cmd` (lowercase) on node `i`.
fn calls(cluster: &Cluster, i: usize, cmd: &str) -> u64 {
    let info = cluster.node(i).admin().info("commandstats");
    let prefix = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn quorum_after_the_validity_is_gone_is_expired_and_cleaned_up() {
    const KEY: &str = "scenario:too-late";
    // Each direction is delayed 400 ms: every reply comes ≥ 800 ms after its SET, past
    // the 500 ms ttl; node_timeout is far above that, so the quorum does come.
    let ttl = Duration::from_millis(500);
    let delay = Duration::from_millis(400);
    let cluster = Cluster::start(3);
    let proxies: Vec<Proxy> = (0..3)
        .map(|i| Proxy::start(cluster.node(i).addr().expect("tcp node")))
        .collect();
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let mut rl = client(&urls, Duration::from_secs(5), 0);
    warm_up(&mut rl, "scenario:warm");
    let evals_before: Vec<u64> = (0..3).map(|i| calls(&cluster, i, "eval")).collect();
    for p in &proxies {
        p.set_mode(Mode::Delay(delay));
    }
    let t = Instant::now();
    let err = rl
        .try_lock(KEY, ttl)
        .expect_err("a quorum that answers after the ttl must not grant a lock");
    let took = t.elapsed();
    match &err {
        Error::Expired(f) => {
            assert_eq!(f.op, Phase::Acquire);
            assert!(
                f.count(|o| *o == Outcome::Locked) >= rl.quorum(),
                "the quorum did agree, too late: {f}"
            );
        }
        e => panic!("expected Error::Expired, got {e:?}"),
    }
    assert!(took >= 2 * delay, "the round took only {took:?}");
    // The failed attempt releases what it set: the compare-and-delete reaches every node
    // (an EVAL, counted by the server) and no key is left, well within a bounded wait.
    assert!(
        wait_until(WAIT, || (0..3)
            .all(|i| calls(&cluster, i, "eval") > evals_before[i])),
        "the cleanup EVAL did not reach every node"
    );
    assert!(
        wait_until(WAIT, || (0..3).all(|i| get(&cluster, i, KEY).is_none())),
        "a key was left behind"
    );
}

// ---------------------------------------------------------------------------------------
// 5. Unsolicited bytes

/// How a [`Puppet`] node answers `SET`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    /// Answers the handshake, nothing else.
    Silent,
    /// `$-1` (held elsewhere), then, `after` later, an unrequested `+OK`.
    NilThenStrayOk { after: Duration },
    /// `$-1` (held elsewhere); an unrequested `+OK` right after it answered the first
    /// script (the release that follows a failed attempt), i.e. between two calls.
    NilThenStrayOkAfterRelease,
    /// `$-1` to the first SET of a connection; to the second, an unrequested `+OK`
    /// *before* its real `$-1`: a reply in place of another, which RESP2 cannot tell.
    StrayOkBeforeSecondReply,
}

#[derive(Default)]
struct PuppetLog {
    accepted: usize,
    sets: usize,
    /// When an unrequested `+OK` was written.
    strays: Vec<Instant>,
    /// When the client closed a connection (EOF seen).
    closed_by_client: Vec<Instant>,
}

/// A fake Redis node on 127.0.0.1:0 that answers PING and scripts like Redis and `SET`
/// as its [`Act`] says. Stops its threads on drop.
struct Puppet {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<PuppetLog>>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Puppet {
    fn start(act: Act) -> Puppet {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind puppet");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("local_addr");
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(PuppetLog::default()));
        let threads: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::new(Mutex::new(Vec::new()));
        let (st, lg, th) = (stop.clone(), log.clone(), threads.clone());
        let acceptor = thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                let Ok((stream, _)) = listener.accept() else {
                    thread::sleep(Duration::from_millis(2));
                    continue;
                };
                guard(&lg).accepted += 1;
                let (st, lg) = (st.clone(), lg.clone());
                guard(&th).push(thread::spawn(move || serve(stream, act, &st, &lg)));
            }
        });
        Puppet {
            addr,
            stop,
            log,
            threads,
            acceptor: Some(acceptor),
        }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    fn log(&self) -> MutexGuard<'_, PuppetLog> {
        guard(&self.log)
    }
}

impl Drop for Puppet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let threads: Vec<_> = guard(&self.threads).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

/// Splits complete RESP commands (arrays of bulk strings) off the front of `buf`; returns
/// each command's name, uppercased.
fn take_commands(buf: &mut Vec<u8>) -> Vec<Vec<u8>> {
    fn line(buf: &[u8], pos: usize) -> Option<(usize, usize)> {
        let rel = buf.get(pos..)?.windows(2).position(|w| w == b"\r\n")?;
        let n = std::str::from_utf8(&buf[pos + 1..pos + rel])
            .ok()?
            .parse()
            .ok()?;
        Some((n, pos + rel + 2))
    }
    let mut names = Vec::new();
    'next: while let Some((argc, mut pos)) = line(buf, 0) {
        let mut name = None;
        for _ in 0..argc {
            let Some((len, start)) = line(buf, pos) else {
                break 'next;
            };
            if buf.len() < start + len + 2 {
                break 'next;
            }
            name.get_or_insert_with(|| buf[start..start + len].to_ascii_uppercase());
            pos = start + len + 2;
        }
        buf.drain(..pos);
        names.push(name.unwrap_or_default());
    }
    names
}

fn serve(mut stream: TcpStream, act: Act, stop: &AtomicBool, log: &Mutex<PuppetLog>) {
    let info = common::fake_info(stream.local_addr().map_or(0, |a| u64::from(a.port())));
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(2)));
    let mut inbox = Vec::new();
    let mut buf = [0u8; 4096];
    let mut stray_at: Option<Instant> = None;
    let mut stray_after_release = false;
    let mut sets_here = 0;
    while !stop.load(Ordering::SeqCst) {
        match stream.read(&mut buf) {
            Ok(0) => {
                guard(log).closed_by_client.push(Instant::now());
                return;
            }
            Ok(n) => inbox.extend_from_slice(&buf[..n]),
            Err(e) if is_timeout(&e) => {}
            Err(_) => {
                guard(log).closed_by_client.push(Instant::now());
                return;
            }
        }
        let mut out = Vec::new();
        for name in take_commands(&mut inbox) {
            match name.as_slice() {
                b"PING" => out.extend_from_slice(b"+PONG\r\n"),
                b"INFO" => out.extend_from_slice(&info),
                b"EVAL" | b"EVALSHA" if act != Act::Silent => {
                    out.extend_from_slice(b":0\r\n");
                    if stray_after_release {
                        stray_after_release = false;
                        stray_at = Some(Instant::now());
                    }
                }
                b"SET" => {
                    guard(log).sets += 1;
                    sets_here += 1;
                    match act {
                        Act::StrayOkBeforeSecondReply => {
                            if sets_here == 2 {
                                out.extend_from_slice(b"+OK\r\n");
                                guard(log).strays.push(Instant::now());
                            }
                            out.extend_from_slice(b"$-1\r\n");
                        }
                        Act::Silent => {}
                        Act::NilThenStrayOk { after } => {
                            out.extend_from_slice(b"$-1\r\n");
                            stray_at = Some(Instant::now() + after);
                        }
                        Act::NilThenStrayOkAfterRelease => {
                            out.extend_from_slice(b"$-1\r\n");
                            stray_after_release = true;
                        }
                    }
                }
                _ if act == Act::Silent => {}
                _ => out.extend_from_slice(b"-ERR unknown command\r\n"),
            }
        }
        if !out.is_empty() && stream.write_all(&out).is_err() {
            return;
        }
        if stray_at.is_some_and(|t| Instant::now() >= t) {
            stray_at = None;
            if stream.write_all(b"+OK\r\n").is_err() {
                return;
            }
            guard(log).strays.push(Instant::now());
        }
    }
}

/// `[real, puppet, silent]`, quorum 2: the real node says yes, the puppet says no (held
/// elsewhere), the silent one never answers SET. Only a stray `+OK` counted as the
/// puppet's vote could ever grant a lock.
fn stray_setup(act: Act) -> (Cluster, Puppet, Puppet, Vec<String>) {
    let cluster = Cluster::start(1);
    let puppet = Puppet::start(act);
    let silent = Puppet::start(Act::Silent);
    let urls = vec![cluster.url(0), puppet.url(), silent.url()];
    (cluster, puppet, silent, urls)
}

/// The puppet answers SET with "held elsewhere", then sends an unrequested `+OK` 20 ms
/// later, while the round still waits for the silent node: the client must take it for
/// what it is (a reply nobody asked for), reset that connection during the round, and
/// never count it.
#[test]
fn reply_nobody_asked_for_during_a_round_resets_the_connection() {
    let (_cluster, puppet, _silent, urls) = stray_setup(Act::NilThenStrayOk {
        after: Duration::from_millis(20),
    });
    // The round waits up to 3 s for the silent node: the stray arrives inside it.
    let mut rl = client(&urls, Duration::from_secs(3), 0);
    let called = Instant::now();
    let result = rl.try_lock("scenario:stray-in-round", LONG_TTL);
    let returned = Instant::now();
    let lock: Option<&Lock> = result.as_ref().ok();
    assert!(
        lock.is_none(),
        "a stray +OK was counted as a vote: granted {lock:?}"
    );
    let err = result.expect_err("checked above");
    let f = err.failure().expect("a lock-level error");
    assert_ne!(f.nodes[1].outcome, Outcome::Locked, "{f}");
    let log = puppet.log();
    assert_eq!(log.strays.len(), 1, "the puppet sent its stray reply");
    let stray = log.strays[0];
    assert!(
        stray > called && stray < returned,
        "the stray must arrive during the round"
    );
    assert!(
        log.closed_by_client
            .first()
            .is_some_and(|&c| c >= stray && c < returned),
        "the client must reset the connection when the stray arrives, during the round \
         (closed at {:?}, round ended {:?} after the stray)",
        log.closed_by_client.first().map(|c| *c - stray),
        returned - stray
    );
}

/// The puppet answers SET with "held elsewhere" and sends an unrequested `+OK` right after
/// answering the release of the failed attempt, so it sits in the client's socket before
/// the next call. The next calls must never count it (no lock is ever granted), and the
/// connection it came on must be reset (the puppet sees a new connection).
#[test]
fn reply_nobody_asked_for_between_rounds_is_never_a_vote() {
    let (_cluster, puppet, _silent, urls) = stray_setup(Act::NilThenStrayOkAfterRelease);
    let mut rl = client(&urls, Duration::from_millis(200), 0);
    const CALLS: usize = 4;
    for call in 0..CALLS {
        let strays = puppet.log().strays.len();
        if let Ok(lock) = rl.try_lock("scenario:stray-between", LONG_TTL) {
            panic!("call {call}: a stray +OK was counted as a vote: granted {lock:?}");
        }
        if call > 0 {
            // This call found the previous call's stray before writing anything, and
            // dropped the connection it came on.
            assert!(
                wait_until(WAIT, || puppet.log().closed_by_client.len() >= call),
                "call {call}: the connection that carried the stray was not reset: {} \
                 closed",
                puppet.log().closed_by_client.len()
            );
        }
        // The release of the failed attempt is answered, then the stray follows it, while
        // the client is idle.
        assert!(
            wait_until(WAIT, || puppet.log().strays.len() > strays),
            "call {call}: the puppet never sent its stray reply"
        );
    }
    let log = puppet.log();
    assert!(
        log.sets >= CALLS,
        "each call reached the puppet: {} SETs",
        log.sets
    );
    assert!(
        log.accepted >= CALLS,
        "each stray cost the client its connection: {} connections",
        log.accepted
    );
}

/// What cannot be detected, and what then can: the puppet answers the second SET with an
/// unrequested `+OK` written *before* the real reply. RESP2 has no request ids, so the
/// `+OK` is indistinguishable from the answer (it may be counted as the puppet's vote:
/// this test does not assert either way). The real reply then arrives with nothing owed
/// for it, and the client must drop the connection (at the latest on its next call) and
/// never count that reply.
#[test]
fn reply_in_place_of_another_is_caught_one_reply_later() {
    let (_cluster, puppet, _silent, urls) = stray_setup(Act::StrayOkBeforeSecondReply);
    let mut rl = client(&urls, Duration::from_millis(200), 0);
    const KEY: &str = "scenario:stray-in-place";
    if let Ok(lock) = rl.try_lock(KEY, LONG_TTL) {
        panic!("call 1: only the real node said yes, yet granted {lock:?}");
    }
    assert!(puppet.log().closed_by_client.is_empty());
    // Call 2: the stray goes first. Whatever the outcome, release what it may hold.
    if let Ok(lock) = rl.try_lock(KEY, LONG_TTL) {
        let _ = rl.unlock(&lock);
    }
    assert_eq!(puppet.log().strays.len(), 1, "the puppet sent its stray");
    // Call 3 (if the reset did not already happen in call 2): the real reply to call 2's
    // SET, waiting unasked in the socket, is found before anything is written.
    let _ = rl.try_lock(KEY, LONG_TTL);
    assert!(
        wait_until(WAIT, || !puppet.log().closed_by_client.is_empty()),
        "the reply that followed the stray was never noticed: the stream stayed shifted"
    );
    let _ = rl.try_lock(KEY, LONG_TTL);
    assert!(
        wait_until(WAIT, || puppet.log().accepted >= 2),
        "the client reconnected"
    );
}
