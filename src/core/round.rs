//! One round: one command sent to every node, for one or more resources ("slots"), and
//! the votes that come back.
//!
//! # BE ADVISED
//!
//! A round is the whole safety argument of Redlock in miniature, so its rules are few
//! and strict:
//!
//! - Each (slot, node) pair votes at most once. A vote is one of: yes (`Locked`,
//!   `Released`), no (`Held`, `NotHeld`), or failed (`NoReply`, `Failed`). Later replies
//!   for a decided pair are ignored. A node still pending when its slot was decided is
//!   reported `NotNeeded`: not waited for, not a failure.
//! - Acquire and extend decide per slot as soon as the votes allow: `yes ≥ quorum` is
//!   `Won`; `no > n − quorum` is `Taken` (others hold it: no quorum can exist);
//!   `no + failed > n − quorum` is `Unavailable`. Waiting for the slow minority after
//!   that would only add latency.
//! - Release is `Done` as soon as a majority has answered (it reports how many of those
//!   deleted), or when so many failed that no majority can answer, or when none is
//!   pending; the replies still owed are read, and dropped, by later calls. Votes
//!   recorded after the decision (the rest of the same batch of replies) still count in
//!   [`Round::yes`].
//! - [`Round::time_out`] turns every pending vote into `NoReply`, which decides every
//!   slot. Nothing here reads a clock: the caller says when time is up.
//! - A decision is stamped with the time it was taken by [`Round::stamp`], which the
//!   caller calls with one clock reading after each batch of replies (and
//!   [`Round::time_out`] stamps with the time it is given). A stamp is never earlier than
//!   the replies that made the decision were read, which is the safe direction for a
//!   lock's validity; until stamped, [`Round::decided_at`] is `None`. A release that a
//!   majority answered is never stamped: the lock is free, and its time is read by no
//!   one (only a release that failed reports how long it took), so its round costs no
//!   clock reading.
//!
//! Changing a threshold here changes the mutual-exclusion guarantee; the tests at the
//! bottom and `tests/sim.rs` pin them down.

use crate::error::{NodeError, Outcome, Phase};
use crate::resp::Reply;
use std::time::Instant;

use super::quorum::quorum;

/// Where a slot stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not decided yet.
    Open,
    /// A quorum said yes (acquire, extend).
    Won,
    /// So many nodes said no that no quorum is possible (acquire, extend).
    Taken,
    /// So many nodes failed or said no that no quorum is possible (acquire, extend).
    Unavailable,
    /// A majority answered, or no majority can any more (release).
    Done,
}

/// What one reply to a `phase` command means for the lock, in the one vocabulary of the
/// crate, from here up to the public error: `Locked`/`Released` (a yes), `Held`/`NotHeld`
/// (a no), or `Failed` with why. Two failures are not votes but tell the caller what to
/// do: [`NodeError::NoScript`] (send the script itself with `EVAL`, and wait again) and
/// any error that [breaks the stream](NodeError::breaks_stream) (the reply does not fit
/// its command: the connection is no longer in step and must be dropped). Only a failure,
/// the rare case, copies anything out of the reply.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::round::interpret;
/// use quorumlock::__private::resp::Reply;
/// use quorumlock::{NodeError, Outcome, Phase};
///
/// assert_eq!(interpret(Phase::Acquire, &Reply::Simple(b"OK")), Outcome::Locked);
/// assert_eq!(interpret(Phase::Acquire, &Reply::Bulk(None)), Outcome::Held);
/// assert_eq!(interpret(Phase::Release, &Reply::Integer(0)), Outcome::NotHeld);
/// assert_eq!(
///     interpret(Phase::Release, &Reply::Error(b"NOSCRIPT No matching script")),
///     Outcome::Failed(NodeError::NoScript),
/// );
/// ```
#[inline]
pub fn interpret(phase: Phase, reply: &Reply<'_>) -> Outcome {
    match (phase, *reply) {
        (_, Reply::Error(msg)) => {
            Outcome::Failed(if phase != Phase::Acquire && msg.starts_with(b"NOSCRIPT") {
                NodeError::NoScript
            } else {
                NodeError::server(msg)
            })
        }
        (Phase::Acquire, Reply::Simple(b"OK")) => Outcome::Locked,
        (Phase::Acquire, Reply::Bulk(None)) => Outcome::Held,
        (Phase::Acquire, _) => Outcome::Failed(NodeError::UnexpectedReply(
            "SET NX answered with neither OK nor nil",
        )),
        (_, Reply::Integer(yes @ (0 | 1))) => Outcome::vote(phase, yes == 1),
        (_, _) => Outcome::Failed(NodeError::UnexpectedReply(
            "script answered with something other than 0 or 1",
        )),
    }
}

/// The hot-path reading of a reply: when `buf` starts with one of the two common answers to
/// `phase` (`+OK` / `$-1` to `SET NX`, `:1` / `:0` to a script), the vote (yes or no)
/// and the reply's length. `None` for anything else, complete or not: the caller then
/// decodes it in full. Never accepts bytes that [`decode`](crate::resp::decode()) followed
/// by [`interpret`] would read differently (the tests check this exhaustively).
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::round::quick_vote;
/// use quorumlock::Phase;
///
/// assert_eq!(quick_vote(Phase::Acquire, b"+OK\r\n:1\r\n"), Some((true, 5)));
/// assert_eq!(quick_vote(Phase::Release, b":0\r\n"), Some((false, 4)));
/// assert_eq!(quick_vote(Phase::Release, b"+OK\r\n"), None); // a desync: the slow path
/// assert_eq!(quick_vote(Phase::Acquire, b"+OK\r"), None); // incomplete
/// ```
#[inline(always)]
pub fn quick_vote(phase: Phase, buf: &[u8]) -> Option<(bool, usize)> {
    // One 4-byte compare per form instead of byte by byte.
    let head = u32::from_le_bytes(*buf.first_chunk::<4>()?);
    if phase == Phase::Acquire {
        if buf.get(4) != Some(&b'\n') {
            return None;
        }
        match head {
            h if h == u32::from_le_bytes(*b"+OK\r") => Some((true, 5)),
            h if h == u32::from_le_bytes(*b"$-1\r") => Some((false, 5)),
            _ => None,
        }
    } else {
        match head {
            h if h == u32::from_le_bytes(*b":1\r\n") => Some((true, 4)),
            h if h == u32::from_le_bytes(*b":0\r\n") => Some((false, 4)),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    yes: u32,
    no: u32,
    failed: u32,
    pending: u32,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    tally: Tally,
    decision: Decision,
    /// Who has voted on this slot, among nodes 0..64 (the rest are in `Round::more`).
    marks: Marks,
    decided_at: Option<Instant>,
    /// The largest fence counter among the counted yes votes (a fenced acquire).
    counter: Option<u64>,
}

/// Which of 64 nodes have voted on a slot, and which of those voted yes. A node that
/// voted and not yes voted no, or failed (then its detail is in `Round::failures`).
#[derive(Clone, Copy, Debug, Default)]
struct Marks {
    voted: u64,
    yes: u64,
}

/// The votes of one round. Reused from round to round without reallocating.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::round::{Decision, Round};
/// use quorumlock::{Outcome, Phase};
///
/// let mut round = Round::default();
/// round.begin(Phase::Acquire, 5, 1);
/// round.record(0, 0, Outcome::Locked);
/// round.record(3, 0, Outcome::Locked);
/// assert_eq!(round.decision(0), Decision::Open);
/// round.record(1, 0, Outcome::Locked);
/// assert_eq!(round.decision(0), Decision::Won); // nodes 2 and 4 never needed
/// assert!(round.is_done());
/// // The caller reads the clock once the replies are handled, and stamps the decision
/// // with `Round::stamp`.
/// assert!(round.has_unstamped());
/// ```
#[derive(Clone, Debug, Default)]
pub struct Round {
    phase: Option<Phase>,
    nodes: usize,
    slots: Vec<Slot>,
    // INVARIANT: more.len() == slots.len() * (nodes.div_ceil(64) - 1), at least 0: node
    // `n >= 64`'s vote on slot `s` is bit `n % 64` of `more[s * (words - 1) + n / 64 - 1]`;
    // nodes below 64 are in the slot's own `marks` (the common case: a round touches one
    // `Slot` per vote, and a new round clears its votes by overwriting the slots).
    more: Vec<Marks>,
    // The detail of every failed vote, by `slot * nodes + node`. Kept apart so the votes
    // themselves stay two bits each: this is the hot path.
    failures: Vec<(usize, Outcome)>,
    open: usize,
    /// `quorum(nodes)`, and how many nodes may fail or refuse before no quorum is left.
    quorum: u32,
    spare: u32,
    /// Slots decided but not yet stamped with a time.
    unstamped: Vec<u32>,
}

/// One vote, as recorded: `Yes`/`No` read as `Locked`/`Held` or `Released`/`NotHeld`
/// depending on the round's phase ([`Outcome::vote`]), `Failed` has its detail in
/// `Round::failures`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Vote {
    Yes,
    No,
    Failed,
}

impl Round {
    /// Feeds into `h` everything that decides what the round does next, for the model
    /// checker's state fingerprints (`tests/model.rs`): hashed field by field, not through
    /// its `Debug` text (which cost half the explorer's time). Off the production paths.
    #[doc(hidden)]
    pub fn fingerprint<H: std::hash::Hasher>(&self, h: &mut H) {
        use std::hash::Hash;
        (self.phase.map(|p| p as u8), self.nodes, self.open).hash(h);
        (
            self.quorum,
            self.spare,
            &self.unstamped[..],
            self.slots.len(),
        )
            .hash(h);
        for s in &self.slots {
            let t = s.tally;
            (t.yes, t.no, t.failed, t.pending, s.decision as u8).hash(h);
            (s.marks.voted, s.marks.yes, s.decided_at, s.counter).hash(h);
        }
        self.more.len().hash(h);
        for m in &self.more {
            (m.voted, m.yes).hash(h);
        }
        self.failures.len().hash(h);
        for (i, o) in &self.failures {
            i.hash(h);
            super::session::debug_hash(h, o);
        }
    }

    /// Starts a round of `phase` over `nodes` nodes for `slots` resources; every vote
    /// pending.
    pub fn begin(&mut self, phase: Phase, nodes: usize, slots: usize) {
        self.phase = Some(phase);
        self.nodes = nodes;
        let open = Slot {
            tally: Tally {
                pending: nodes as u32,
                ..Tally::default()
            },
            decision: Decision::Open,
            marks: Marks::default(),
            decided_at: None,
            counter: None,
        };
        // Same shape as the last round (the common case): overwrite in place, which also
        // clears the votes of nodes below 64. One slot is the most common of all.
        if let ([only], 1) = (&mut self.slots[..], slots) {
            *only = open;
        } else if self.slots.len() == slots {
            // A plain loop: `fill` goes through a generic clone path that costs more than
            // the few slots of a round.
            for slot in &mut self.slots {
                *slot = open;
            }
        } else {
            self.slots.clear();
            self.slots.resize(slots, open);
        }
        if nodes > 64 || !self.more.is_empty() {
            self.more.clear();
            self.more
                .resize(slots * (nodes.div_ceil(64).max(1) - 1), Marks::default());
        }
        if !self.failures.is_empty() {
            self.failures.clear();
        }
        // Room for every node to fail once without allocating: a lagging node in a
        // steady stream of rounds must not cost an allocation per round.
        if self.failures.capacity() < nodes {
            self.failures.reserve(nodes);
        }
        self.unstamped.clear();
        self.open = slots;
        self.quorum = quorum(nodes) as u32;
        self.spare = nodes as u32 - self.quorum.min(nodes as u32);
    }

    /// The marks that hold `node`'s vote on `slot`, and its bit there; `None` when there
    /// is no such node or slot.
    #[inline(always)]
    fn marks(&self, node: usize, slot: usize) -> Option<(&Marks, u64)> {
        if node >= self.nodes {
            return None;
        }
        let bit = 1 << (node % 64);
        if node < 64 {
            return Some((&self.slots.get(slot)?.marks, bit));
        }
        let words = self.nodes.div_ceil(64) - 1;
        Some((self.more.get(slot * words + node / 64 - 1)?, bit))
    }

    /// [`Round::marks`], to record a vote.
    #[inline(always)]
    fn marks_mut(&mut self, node: usize, slot: usize) -> Option<(&mut Marks, u64)> {
        if node >= self.nodes {
            return None;
        }
        let bit = 1 << (node % 64);
        if node < 64 {
            return Some((&mut self.slots.get_mut(slot)?.marks, bit));
        }
        let words = self.nodes.div_ceil(64) - 1;
        Some((self.more.get_mut(slot * words + node / 64 - 1)?, bit))
    }

    /// `node`'s vote on `slot`, as recorded; `None` while pending (or for no such pair).
    fn cast(&self, node: usize, slot: usize) -> Option<Vote> {
        let (m, bit) = self.marks(node, slot)?;
        if m.voted & bit == 0 {
            None
        } else if m.yes & bit != 0 {
            Some(Vote::Yes)
        } else if self
            .failures
            .iter()
            .any(|(i, _)| *i == slot * self.nodes + node)
        {
            Some(Vote::Failed)
        } else {
            Some(Vote::No)
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Nodes needed for a majority.
    pub fn quorum(&self) -> usize {
        quorum(self.nodes)
    }

    /// True once every slot is decided.
    pub fn is_done(&self) -> bool {
        self.open == 0
    }

    /// The decision for `slot`.
    pub fn decision(&self, slot: usize) -> Decision {
        self.slots[slot].decision
    }

    /// When `slot` was decided; `None` until stamped, and for a release that a majority
    /// answered (see the module's rules).
    pub fn decided_at(&self, slot: usize) -> Option<Instant> {
        self.slots[slot].decided_at
    }

    /// Yes votes for `slot` so far (locked, extended or released).
    pub fn yes(&self, slot: usize) -> usize {
        self.slots[slot].tally.yes as usize
    }

    /// Nodes that answered for `slot` (yes or no).
    pub fn answered(&self, slot: usize) -> usize {
        let t = self.slots[slot].tally;
        (t.yes + t.no) as usize
    }

    /// Whether `node` still owes a vote for `slot`.
    pub fn is_pending(&self, node: usize, slot: usize) -> bool {
        self.marks(node, slot)
            .is_some_and(|(m, bit)| m.voted & bit == 0)
    }

    /// `node`'s vote for `slot`, if it has voted.
    pub fn vote(&self, node: usize, slot: usize) -> Option<Outcome> {
        let phase = self.phase?;
        match self.cast(node, slot)? {
            Vote::Yes => Some(Outcome::vote(phase, true)),
            Vote::No => Some(Outcome::vote(phase, false)),
            Vote::Failed => self
                .failures
                .iter()
                .find(|(i, _)| *i == slot * self.nodes + node)
                .map(|(_, o)| o.clone()),
        }
    }

    /// [`Round::vote`] by reference, without cloning a failure's detail: what an
    /// observer is shown. `None` while pending (or for no such pair).
    pub fn vote_ref(&self, node: usize, slot: usize) -> Option<&Outcome> {
        static YES: [Outcome; 4] = [
            Outcome::Locked,
            Outcome::Locked,
            Outcome::Released,
            Outcome::Fenced,
        ];
        static NO: [Outcome; 4] = [
            Outcome::Held,
            Outcome::NotHeld,
            Outcome::NotHeld,
            Outcome::NotHeld,
        ];
        let i = match self.phase? {
            Phase::Acquire => 0,
            Phase::Extend => 1,
            Phase::Release => 2,
            Phase::Fence => 3,
        };
        match self.cast(node, slot)? {
            Vote::Yes => Some(&YES[i]),
            Vote::No => Some(&NO[i]),
            Vote::Failed => self
                .failures
                .iter()
                .find(|(k, _)| *k == slot * self.nodes + node)
                .map(|(_, o)| o),
        }
    }

    /// Which of nodes `64 * word .. 64 * word + 64` have voted on `slot` (bit `n % 64`
    /// for node `n`): a whole word of [`Round::is_pending`] at once. 0 for no such slot
    /// or word.
    #[inline]
    pub fn voted_word(&self, slot: usize, word: usize) -> u64 {
        if word == 0 {
            return self.slots.get(slot).map_or(0, |s| s.marks.voted);
        }
        let words = self.nodes.div_ceil(64).max(1) - 1;
        if word > words {
            return 0;
        }
        self.more
            .get(slot * words + word - 1)
            .map_or(0, |m| m.voted)
    }

    /// The phase of the round, once begun.
    pub fn phase(&self) -> Option<Phase> {
        self.phase
    }

    /// Nodes the round is over.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The votes for `slot`, by node; pending ones read as `NotNeeded` (the slot was
    /// decided without them: a timeout records `NoReply` for every pending vote).
    pub fn outcomes(&self, slot: usize) -> impl Iterator<Item = Outcome> + '_ {
        (0..self.nodes).map(move |node| self.vote(node, slot).unwrap_or(Outcome::NotNeeded))
    }

    /// Records `node`'s vote for `slot`; true when it was a yes, counted. A second vote
    /// for the same pair is ignored.
    #[inline]
    pub fn record(&mut self, node: usize, slot: usize, outcome: Outcome) -> bool {
        let cast = match outcome {
            Outcome::Locked | Outcome::Released | Outcome::Fenced => Vote::Yes,
            Outcome::Held | Outcome::NotHeld => Vote::No,
            Outcome::NoReply | Outcome::Failed(_) => Vote::Failed,
            // Not a vote: what a pending one reads as once its slot is decided.
            Outcome::NotNeeded => return false,
        };
        let Some((m, bit)) = self.marks_mut(node, slot) else {
            return false;
        };
        if m.voted & bit != 0 {
            return false;
        }
        m.voted |= bit;
        if cast == Vote::Yes {
            m.yes |= bit;
        }
        let t = &mut self.slots[slot].tally;
        t.pending -= 1;
        match cast {
            Vote::Yes => t.yes += 1,
            Vote::No => t.no += 1,
            Vote::Failed => {
                t.failed += 1;
                self.failures.push((slot * self.nodes + node, outcome));
            }
        }
        self.decide(slot);
        cast == Vote::Yes
    }

    /// Notes a fence counter read with a counted yes for `slot`: [`Round::counter`] is
    /// the largest.
    pub fn raise_counter(&mut self, slot: usize, counter: u64) {
        if let Some(s) = self.slots.get_mut(slot) {
            s.counter = Some(match s.counter {
                Some(first) if super::fault!(FenceFromOneNode) => first,
                c => c.map_or(counter, |c| c.max(counter)),
            });
        }
    }

    /// The largest fence counter read with a counted yes for `slot` (a fenced acquire);
    /// `None` when no yes carried one.
    pub fn counter(&self, slot: usize) -> Option<u64> {
        self.slots.get(slot).and_then(|s| s.counter)
    }

    /// Records a yes or no vote: the hot-path form of [`Round::record`].
    #[inline]
    pub fn tally(&mut self, node: usize, slot: usize, yes: bool) {
        if node >= 64 {
            return self.tally_wide(node, slot, yes);
        }
        // One slot, one bit: the vote, the count and the decision in one place.
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        let bit = 1 << node;
        if s.marks.voted & bit != 0 || node >= self.nodes {
            return;
        }
        s.marks.voted |= bit;
        if yes {
            s.marks.yes |= bit;
            s.tally.yes += 1;
        } else {
            s.tally.no += 1;
        }
        s.tally.pending -= 1;
        if s.decision != Decision::Open {
            return;
        }
        if let Some(d) = rule(self.phase, self.quorum, self.spare, s.tally) {
            s.decision = d;
            if needs_stamp(self.phase, self.quorum, s.tally) {
                self.unstamped.push(slot as u32);
            }
            self.open -= 1;
        }
    }

    /// [`Round::tally`] for a node from 64 on.
    #[cold]
    fn tally_wide(&mut self, node: usize, slot: usize, yes: bool) {
        let outcome = self.phase.map(|phase| Outcome::vote(phase, yes));
        if let Some(outcome) = outcome {
            self.record(node, slot, outcome);
        }
    }

    /// Records a failure of `node` for every slot it still owes a vote.
    pub fn fail_node(&mut self, node: usize, error: &NodeError) {
        for slot in 0..self.slots.len() {
            if self.is_pending(node, slot) {
                self.record(node, slot, Outcome::Failed(error.clone()));
            }
        }
    }

    /// Time is up at `now`: every pending vote becomes `NoReply`, which decides every
    /// slot, and every decision not stamped yet is stamped `now`.
    pub fn time_out(&mut self, now: Instant) {
        for slot in 0..self.slots.len() {
            for node in 0..self.nodes {
                if self.is_pending(node, slot) {
                    self.record(node, slot, Outcome::NoReply);
                }
            }
        }
        self.stamp(now);
    }

    /// True when some slot was decided since the last [`Round::stamp`].
    #[inline]
    pub fn has_unstamped(&self) -> bool {
        !self.unstamped.is_empty()
    }

    /// Stamps every decision taken since the last stamp with `now`: the caller reads the
    /// clock after handling a batch of replies, not before, so the stamp is never earlier
    /// than the decision.
    pub fn stamp(&mut self, now: Instant) {
        for &slot in &self.unstamped {
            if let Some(s) = self.slots.get_mut(slot as usize) {
                s.decided_at = Some(now);
            }
        }
        self.unstamped.clear();
    }

    #[inline]
    fn decide(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        if s.decision != Decision::Open {
            return;
        }
        if let Some(d) = rule(self.phase, self.quorum, self.spare, s.tally) {
            s.decision = d;
            if needs_stamp(self.phase, self.quorum, s.tally) {
                self.unstamped.push(slot as u32);
            }
            self.open -= 1;
        }
    }
}

/// What an open slot's votes `t` decide, in a round of `phase` whose quorum is `q` and
/// that can lose `spare` votes; `None` while they decide nothing.
#[inline(always)]
fn rule(phase: Option<Phase>, q: u32, spare: u32, t: Tally) -> Option<Decision> {
    match phase {
        // A release is decided once a majority has answered (the lock is free: no
        // majority holds our key any more) or can no longer answer; the rest of the
        // replies are read, and dropped, by later calls.
        Some(Phase::Release) if t.yes + t.no >= q || t.pending == 0 || t.failed > spare => {
            Some(Decision::Done)
        }
        Some(Phase::Release) => None,
        _ if t.yes >= q => Some(Decision::Won),
        _ if t.no > spare => Some(Decision::Taken),
        _ if t.no + t.failed > spare => Some(Decision::Unavailable),
        _ => None,
    }
}

/// Whether a decision just taken on votes `t` is to be stamped with its time: every one
/// but a release that a majority answered (see the module's rules).
#[inline(always)]
fn needs_stamp(phase: Option<Phase>, q: u32, t: Tally) -> bool {
    phase != Some(Phase::Release) || t.yes + t.no < q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_runs_no_scripts_says_so() {
        let off = |msg: &[u8]| {
            matches!(
                interpret(Phase::Release, &Reply::Error(msg)),
                Outcome::Failed(NodeError::ScriptingOff(_))
            )
        };
        // Garnet without --lua; EVAL renamed away (Redis 7, 6.2); an ACL without it.
        assert!(off(b"ERR This instance has Lua scripting support disabled"));
        assert!(off(
            b"ERR unknown command 'EVAL', with args beginning with: 'if' "
        ));
        assert!(off(
            b"ERR unknown command `evalsha`, with args beginning with: "
        ));
        assert!(off(
            b"NOPERM User app has no permissions to run the 'eval' command"
        ));
        assert!(off(
            b"NOPERM this user has no permissions to run the 'evalsha' command or its subcommand"
        ));
        // Anything else is the server's own error.
        for other in [
            &b"ERR unknown command 'FOO'"[..],
            b"NOPERM this user has no permissions to access one of the keys used as arguments",
            b"OOM command not allowed when used memory > 'maxmemory'.",
            b"CROSSSLOT Keys in request don't hash to the same slot",
        ] {
            assert!(matches!(
                interpret(Phase::Release, &Reply::Error(other)),
                Outcome::Failed(NodeError::Server(_))
            ));
        }
    }

    /// The one clock reading of these tests: every other instant is built from it.
    fn base() -> Instant {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *BASE.get_or_init(Instant::now)
    }
    fn round(phase: Phase, n: usize) -> (Round, Instant) {
        let mut r = Round::default();
        r.begin(phase, n, 1);
        (r, base())
    }

    #[test]
    fn acquire_wins_at_quorum_without_the_slow_minority() {
        let (mut r, _) = round(Phase::Acquire, 5);
        r.record(4, 0, Outcome::Locked);
        r.record(2, 0, Outcome::Held);
        r.record(0, 0, Outcome::Locked);
        assert_eq!(r.decision(0), Decision::Open);
        r.record(1, 0, Outcome::Locked);
        assert_eq!(r.decision(0), Decision::Won);
        assert!(r.is_done());
    }

    #[test]
    fn acquire_is_taken_once_others_hold_a_blocking_minority() {
        let (mut r, _) = round(Phase::Acquire, 5);
        r.record(0, 0, Outcome::Held);
        r.record(1, 0, Outcome::Held);
        assert_eq!(r.decision(0), Decision::Open);
        r.record(2, 0, Outcome::Held);
        assert_eq!(r.decision(0), Decision::Taken);
    }

    #[test]
    fn acquire_is_unavailable_when_failures_rule_out_quorum() {
        let (mut r, _) = round(Phase::Acquire, 5);
        r.fail_node(0, &NodeError::Closed);
        r.record(1, 0, Outcome::Held);
        assert_eq!(r.decision(0), Decision::Open);
        r.record(2, 0, Outcome::NoReply);
        assert_eq!(r.decision(0), Decision::Unavailable);
    }

    #[test]
    fn a_late_vote_never_changes_a_decision() {
        let (mut r, _) = round(Phase::Acquire, 3);
        r.record(0, 0, Outcome::Held);
        r.record(1, 0, Outcome::Held);
        assert_eq!(r.decision(0), Decision::Taken);
        r.record(2, 0, Outcome::Locked);
        r.record(0, 0, Outcome::Locked);
        assert_eq!(r.decision(0), Decision::Taken);
        assert_eq!(r.yes(0), 1);
    }

    #[test]
    fn release_is_done_at_a_majority_of_answers_and_counts_deletions() {
        let (mut r, _) = round(Phase::Release, 5);
        r.record(0, 0, Outcome::Released);
        r.record(1, 0, Outcome::NotHeld);
        assert_eq!(r.decision(0), Decision::Open);
        r.record(3, 0, Outcome::Released);
        assert_eq!(r.decision(0), Decision::Done);
        assert_eq!((r.yes(0), r.answered(0)), (2, 3));
        let outcomes: Vec<_> = r.outcomes(0).collect();
        assert_eq!(
            outcomes,
            [
                Outcome::Released,
                Outcome::NotHeld,
                Outcome::NotNeeded,
                Outcome::Released,
                Outcome::NotNeeded
            ]
        );
    }

    #[test]
    fn release_is_done_when_no_majority_can_answer() {
        let (mut r, t) = round(Phase::Release, 5);
        r.record(0, 0, Outcome::Released);
        r.record(1, 0, Outcome::NoReply);
        r.record(2, 0, Outcome::Failed(NodeError::Lagging));
        assert_eq!(r.decision(0), Decision::Open);
        r.record(3, 0, Outcome::Failed(NodeError::Closed));
        assert_eq!(r.decision(0), Decision::Done);
        assert_eq!(r.answered(0), 1);
        let (mut r, _) = round(Phase::Release, 3);
        r.record(0, 0, Outcome::Released);
        r.time_out(t);
        assert_eq!((r.decision(0), r.answered(0)), (Decision::Done, 1));
    }

    #[test]
    fn time_out_decides_every_slot() {
        let mut r = Round::default();
        r.begin(Phase::Acquire, 5, 3);
        let t = base();
        for node in 0..3 {
            r.record(node, 0, Outcome::Locked);
            r.record(node, 1, Outcome::Held);
        }
        r.record(0, 2, Outcome::Locked);
        assert_eq!(
            (r.decision(0), r.decision(1), r.decision(2)),
            (Decision::Won, Decision::Taken, Decision::Open)
        );
        r.time_out(t);
        assert_eq!(r.decision(2), Decision::Unavailable);
        assert!(r.is_done());
    }

    #[test]
    fn every_vote_combination_respects_the_majority_rule() {
        // Exhaustive over 5 nodes × 4 kinds of vote: never Won without a majority of yes,
        // never Taken without a blocking minority of no, always decided when all voted.
        let kinds = [
            Outcome::Locked,
            Outcome::Held,
            Outcome::NoReply,
            Outcome::Failed(NodeError::Closed),
        ];
        for code in 0..4usize.pow(5) {
            let (mut r, _) = round(Phase::Acquire, 5);
            let mut c = code;
            let (mut yes, mut no) = (0, 0);
            for node in 0..5 {
                let o = kinds[c % 4].clone();
                c /= 4;
                yes += usize::from(o == Outcome::Locked);
                no += usize::from(o == Outcome::Held);
                r.record(node, 0, o);
            }
            let d = r.decision(0);
            assert_eq!(d == Decision::Won, yes >= 3, "votes {code:#x}");
            // Which loss is reported depends on arrival order, but Taken needs a real
            // blocking minority of other holders, and a round with every vote in is decided.
            if d == Decision::Taken {
                assert!(no >= 3, "votes {code:#x}");
            }
            assert_ne!(d, Decision::Open, "votes {code:#x}");
        }
    }

    #[test]
    fn interpret_maps_replies_and_flags_desync() {
        let desync = |o: Outcome| matches!(o, Outcome::Failed(e) if e.breaks_stream());
        assert!(desync(interpret(Phase::Acquire, &Reply::Integer(1))));
        assert_eq!(
            interpret(Phase::Acquire, &Reply::Simple(b"OK")),
            Outcome::Locked
        );
        assert_eq!(interpret(Phase::Acquire, &Reply::Bulk(None)), Outcome::Held);
        assert_eq!(
            interpret(Phase::Extend, &Reply::Integer(1)),
            Outcome::Locked
        );
        assert_eq!(
            interpret(Phase::Extend, &Reply::Integer(0)),
            Outcome::NotHeld
        );
        assert_eq!(
            interpret(Phase::Release, &Reply::Integer(1)),
            Outcome::Released
        );
        assert_eq!(
            interpret(Phase::Release, &Reply::Integer(0)),
            Outcome::NotHeld
        );
        assert!(desync(interpret(Phase::Release, &Reply::Integer(7))));
        assert!(desync(interpret(Phase::Release, &Reply::Simple(b"OK"))));
        // NOSCRIPT cannot happen to SET: it is an ordinary refusal there.
        assert_eq!(
            interpret(Phase::Acquire, &Reply::Error(b"NOSCRIPT x")),
            Outcome::Failed(NodeError::Server("NOSCRIPT x".into()))
        );
        assert_eq!(
            interpret(Phase::Extend, &Reply::Error(b"NOSCRIPT x")),
            Outcome::Failed(NodeError::NoScript)
        );
        let refused = interpret(Phase::Extend, &Reply::Error(b"OOM"));
        assert_eq!(refused, Outcome::Failed(NodeError::Server("OOM".into())));
        assert!(!desync(refused));
    }

    #[test]
    fn decisions_are_stamped_by_the_caller_and_time_out_stamps_its_own() {
        let (mut r, t) = round(Phase::Acquire, 3);
        r.tally(0, 0, true);
        r.tally(1, 0, true);
        assert_eq!(r.decision(0), Decision::Won);
        assert_eq!(
            r.decided_at(0),
            None,
            "not stamped before the caller reads the clock"
        );
        assert!(r.has_unstamped());
        let later = t + std::time::Duration::from_millis(5);
        r.stamp(later);
        assert_eq!(r.decided_at(0), Some(later));
        assert!(!r.has_unstamped());
        // A later stamp does not move an earlier decision.
        r.stamp(later + std::time::Duration::from_secs(1));
        assert_eq!(r.decided_at(0), Some(later));

        let (mut r, t) = round(Phase::Acquire, 3);
        r.tally(0, 0, true);
        r.time_out(t);
        assert_eq!(r.decision(0), Decision::Unavailable);
        assert_eq!(r.decided_at(0), Some(t));
        // A fresh round forgets stamps it was never given.
        r.begin(Phase::Acquire, 3, 1);
        r.tally(0, 0, false);
        r.tally(1, 0, false);
        assert!(r.has_unstamped());
        assert_eq!(r.decided_at(0), None);
    }

    /// A release that a majority answered needs no time (the lock is free): it is not
    /// stamped, and the caller reads no clock for it. One that failed is stamped.
    #[test]
    fn a_release_a_majority_answered_is_not_stamped() {
        let (mut r, t) = round(Phase::Release, 5);
        r.tally(0, 0, true);
        r.tally(1, 0, false);
        r.tally(2, 0, true);
        assert_eq!(r.decision(0), Decision::Done);
        assert!(!r.has_unstamped());
        r.stamp(t);
        assert_eq!(r.decided_at(0), None);
        let (mut r, t) = round(Phase::Release, 5);
        r.tally(0, 0, true);
        for node in 1..4 {
            r.record(node, 0, Outcome::NoReply);
        }
        assert_eq!((r.decision(0), r.answered(0)), (Decision::Done, 1));
        assert!(r.has_unstamped());
        r.stamp(t);
        assert_eq!(r.decided_at(0), Some(t));
        // An acquire is always stamped.
        let (mut r, _) = round(Phase::Acquire, 5);
        for node in 0..3 {
            r.tally(node, 0, true);
        }
        assert!(r.has_unstamped());
    }

    /// Every byte string of up to 6 bytes over the alphabet replies are made of, plus
    /// random ones: whatever `quick_vote` accepts, the full decoder reads the same way
    /// (same length, same vote); and it accepts each common reply wherever it stands.
    #[test]
    fn quick_vote_agrees_with_the_full_decoder() {
        use crate::resp::{Limits, decode};
        let alphabet = b"+-:$*OK01\r\nX";
        let limits = Limits::default();
        let check = |kind: Phase, buf: &[u8]| {
            if let Some((yes, used)) = quick_vote(kind, buf) {
                let (reply, len) = decode(buf, &limits)
                    .expect("accepted bytes must parse")
                    .expect("accepted bytes must be complete");
                assert_eq!(len, used, "{:?}", buf.escape_ascii().to_string());
                let want = Outcome::vote(kind, yes);
                assert_eq!(interpret(kind, &reply), want, "{kind:?}");
            }
        };
        let mut buf = Vec::new();
        for len in 0..=6u32 {
            for code in 0..(alphabet.len() as u64).pow(len) {
                buf.clear();
                let mut c = code;
                for _ in 0..len {
                    buf.push(alphabet[(c % alphabet.len() as u64) as usize]);
                    c /= alphabet.len() as u64;
                }
                for kind in [Phase::Acquire, Phase::Extend, Phase::Release] {
                    check(kind, &buf);
                }
            }
        }
        let mut rng = fastrand::Rng::with_seed(5);
        for _ in 0..200_000 {
            buf.clear();
            buf.extend((0..rng.usize(0..12)).map(|_| alphabet[rng.usize(..alphabet.len())]));
            for kind in [Phase::Acquire, Phase::Extend, Phase::Release] {
                check(kind, &buf);
            }
        }
        for (kind, reply, vote) in [
            (Phase::Acquire, &b"+OK\r\n"[..], Some((true, 5))),
            (Phase::Acquire, b"$-1\r\n", Some((false, 5))),
            (Phase::Extend, b":1\r\n", Some((true, 4))),
            (Phase::Release, b":0\r\n", Some((false, 4))),
            (Phase::Acquire, b":1\r\n", None),
            (Phase::Release, b"$-1\r\n", None),
        ] {
            let mut stream = reply.to_vec();
            stream.extend_from_slice(b"+OK\r\n");
            assert_eq!(quick_vote(kind, &stream), vote);
        }
    }

    /// Nodes past 64 keep their votes apart from the first 64's and from each other's,
    /// per slot; an out-of-range node or slot records nothing.
    #[test]
    fn many_nodes_and_slots_keep_every_vote_apart() {
        let nodes = 150;
        let mut r = Round::default();
        for _ in 0..2 {
            r.begin(Phase::Acquire, nodes, 3);
            let mut want = vec![vec![None; nodes]; 3];
            let mut rng = fastrand::Rng::with_seed(nodes as u64);
            for _ in 0..400 {
                let (node, slot) = (rng.usize(..nodes), rng.usize(..3));
                let outcome = match rng.u8(..3) {
                    0 => Outcome::Locked,
                    1 => Outcome::Held,
                    _ => Outcome::Failed(NodeError::Closed),
                };
                let first = want[slot][node].is_none();
                r.record(node, slot, outcome.clone());
                if first {
                    want[slot][node] = Some(outcome);
                }
            }
            for (slot, want) in want.iter().enumerate() {
                for (node, want) in want.iter().enumerate() {
                    assert_eq!(r.vote(node, slot), *want, "node {node} slot {slot}");
                    assert_eq!(r.is_pending(node, slot), want.is_none());
                }
                let yes = want.iter().filter(|o| **o == Some(Outcome::Locked)).count();
                assert_eq!(r.yes(slot), yes);
            }
            assert!(!r.record(nodes, 0, Outcome::Locked));
            assert!(!r.record(0, 3, Outcome::Locked));
            assert_eq!(r.vote(nodes, 0), None);
        }
        // Back to a few nodes: nothing of the large round is left.
        r.begin(Phase::Acquire, 5, 1);
        assert!((0..5).all(|node| r.is_pending(node, 0)));
    }

    #[test]
    fn tally_and_record_agree() {
        let (mut a, _) = round(Phase::Release, 3);
        let (mut b, _) = round(Phase::Release, 3);
        a.tally(0, 0, true);
        a.tally(1, 0, false);
        a.tally(1, 0, true); // second vote ignored
        b.record(0, 0, Outcome::Released);
        b.record(1, 0, Outcome::NotHeld);
        assert_eq!(
            a.outcomes(0).collect::<Vec<_>>(),
            b.outcomes(0).collect::<Vec<_>>()
        );
        assert_eq!((a.yes(0), a.answered(0)), (1, 2));
    }

    #[test]
    fn vote_ref_is_vote_by_reference() {
        for phase in [Phase::Acquire, Phase::Extend, Phase::Release, Phase::Fence] {
            let (mut r, _) = round(phase, 70);
            r.begin(phase, 70, 2);
            r.tally(0, 0, true);
            r.tally(1, 1, false);
            r.tally(65, 0, true);
            r.record(2, 0, Outcome::Failed(NodeError::Lagging));
            r.record(66, 1, Outcome::NoReply);
            for slot in 0..2 {
                for node in 0..70 {
                    assert_eq!(r.vote_ref(node, slot).cloned(), r.vote(node, slot));
                }
            }
            assert_eq!((r.phase(), r.nodes()), (Some(phase), 70));
            for slot in 0..2 {
                for node in 0..70 {
                    let bit = r.voted_word(slot, node / 64) >> (node % 64) & 1;
                    assert_eq!(bit == 0, r.is_pending(node, slot), "{slot} {node}");
                }
            }
            assert_eq!((r.voted_word(2, 0), r.voted_word(0, 2)), (0, 0));
        }
    }
}
