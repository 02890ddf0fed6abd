//! An explicit-state explorer: depth-first search over every enabled action of every
//! state, with the states it has seen kept as 64-bit fingerprints, so that each state is
//! expanded once however many interleavings reach it, and with sleep sets, so that two
//! independent actions are not taken in both orders where either order reaches one state.
//!
//! # Sleep sets (partial-order reduction)
//!
//! The model says which pairs of actions are independent in a state ([`Model::independent`]):
//! both orders reach the same state, and neither disables the other. After the explorer
//! has taken `a` from a state `s`, a later sibling `b` independent of `a` leads to a child
//! whose sleep set holds `a`: taking `a` there would reach `s·a·b`, which the subtree
//! under `s·a` already reaches. Sleep sets prune transitions, never states: every
//! reachable state is still visited (Godefroid, *Partial-Order Methods for the
//! Verification of Concurrent Systems*, 1996, ch. 5), so the properties checked on each
//! state, and on each state without actions, lose nothing. With state caching each
//! state's stored sleep set is the set of its actions not yet taken from it; a visit with
//! a smaller sleep set takes the difference and keeps the intersection, as that book
//! prescribes.
//!
//! The relation is the model's claim. [`Options::check_independence`] tests it on the
//! states visited (every one, or a sample): for each pair of enabled actions the model
//! calls independent, both orders are taken, and a pair where one disables the other or
//! the two orders reach different fingerprints is reported as a violation, with its trace.
//!
//! Fingerprints are 64-bit ([`Fingerprinter`]): for a hash that behaves as a random
//! function, two distinct states of a run of 10 million share one with odds of about 3 in
//! a million, which would prune the second unexplored (CI compares whole states with
//! their fingerprints on one configuration, `Options::check_fingerprints`).
//!
//! A state is a whole world (`Clone`): forking it at a choice is one clone, no replay from
//! the root. The model bounds its own depth (ticks of time, attempts, faults), so the
//! search ends; [`MAX_DEPTH`] only guards against a model that forgot to.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Instant;

/// The fingerprints' hash. Each word written goes through a bijection of the state
/// (xor the word in, multiply by an odd constant, xor-shift, multiply, xor-shift: the
/// shape of splitmix64's finaliser), so two runs of writes of one length that differ in
/// any word leave different states however many words follow; only `finish` folds (a
/// 64 x 64 -> 128 bit multiply, halves xored). A state is hundreds of small writes (a
/// `u8`, a `usize`, a short slice): SipHash's per-write cost made hashing a third of the
/// explorer's time, this makes it a few per cent. Not a defence against chosen inputs,
/// which a model's states are not.
#[derive(Clone, Copy)]
pub struct Fingerprinter(u64);

impl Fingerprinter {
    const SEED: u64 = 0x243f_6a88_85a3_08d3;
    const K1: u64 = 0xbf58_476d_1ce4_e5b9;
    const K2: u64 = 0x94d0_49bb_1331_11eb;

    pub fn new() -> Fingerprinter {
        Fingerprinter(Self::SEED)
    }

    fn word(&mut self, w: u64) {
        let mut x = (self.0 ^ w).wrapping_mul(Self::K1);
        x ^= x >> 29;
        x = x.wrapping_mul(Self::K2);
        self.0 = x ^ (x >> 32);
    }
}

impl Hasher for Fingerprinter {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.word(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        // The length in the top byte: "ab" and "ab\0" differ.
        self.word(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 59) ^ 1);
    }

    fn write_u8(&mut self, i: u8) {
        self.word(u64::from(i));
    }

    fn write_u16(&mut self, i: u16) {
        self.word(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.word(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.word(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.word(i as u64);
    }

    fn finish(&self) -> u64 {
        let m = u128::from(self.0 ^ Self::SEED) * u128::from(Self::K1 ^ Self::K2);
        (m as u64) ^ ((m >> 64) as u64)
    }
}

/// Deeper than any bounded model here goes: reaching it is a bug of the model.
pub const MAX_DEPTH: usize = 400;

/// A set of a state's actions, by their index in its [`Model::actions`] list.
type Mask = u128;
const MAX_ACTIONS: usize = Mask::BITS as usize;

/// What the explorer needs of a world.
pub trait Model: Clone {
    /// One choice.
    type Action: Clone + std::fmt::Debug + PartialEq;
    /// Every action enabled here, in a fixed order (empty: the trace ends).
    fn actions(&self, out: &mut Vec<Self::Action>);
    /// Takes `action`.
    fn step(&mut self, action: &Self::Action);
    /// A fingerprint of everything that decides the future of this state.
    fn fingerprint(&self) -> u64;
    /// The whole state, every field (for [`Options::check_fingerprints`]): two states
    /// with one fingerprint must render alike.
    fn full_state(&self) -> String;
    /// Whether `a` and `b`, both enabled here, commute: either order reaches one state,
    /// and neither disables the other. `false` is always sound (no reduction).
    fn independent(&self, a: &Self::Action, b: &Self::Action) -> bool;
    /// The first "always" property this state violates, if any (checked on every state).
    fn violation(&self) -> Option<String>;
    /// The properties of a finished trace, checked on every state without actions.
    fn at_end(&self) -> Option<String>;
    /// The "sometimes" properties that hold here, as bits.
    fn reached(&self) -> u32;
}

/// How to explore.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// A search, not a proof: stop once every one of these "sometimes" bits is reached
    /// (0: explore everything).
    pub stop: u32,
    /// Prune with sleep sets ([`Model::independent`]).
    pub reduce: bool,
    /// Test the independence relation on every this-many-th new state, in the search's
    /// order (1: every state, several times slower; 0: none): the same states on every
    /// run of a configuration, spread over the whole search.
    pub check_independence: u64,
    /// Test the fingerprints: keep, for each fingerprint, a hash of the whole state it
    /// first stood for ([`Model::full_state`]), and report a violation when a state
    /// reached later has the same fingerprint and a different whole state (a field the
    /// fingerprint leaves out, that would merge the two unexplored). Every transition's
    /// state is rendered: several times slower.
    pub check_fingerprints: bool,
}

/// What one exploration found.
#[derive(Debug)]
pub struct Report<A> {
    /// Transitions taken (states generated, duplicates included).
    pub explored: u64,
    /// Distinct states (fingerprints).
    pub unique: u64,
    /// The longest trace.
    pub max_depth: usize,
    /// States without actions (finished traces).
    pub ends: u64,
    /// Pairs of actions whose independence was tested (`check_independence`).
    pub pairs_checked: u64,
    /// Transitions whose whole state was compared with its fingerprint's first one
    /// (`check_fingerprints`).
    pub fingerprints_checked: u64,
    /// Seconds of wall-clock time (reported, never asserted).
    pub secs: f64,
    /// The "sometimes" bits reached, and for each bit the first trace reaching it.
    pub reached: u32,
    pub witnesses: Vec<(u32, Vec<A>)>,
    /// The first violation, with the trace from the initial state.
    pub violation: Option<(String, Vec<A>)>,
}

impl<A> Default for Report<A> {
    fn default() -> Self {
        Report {
            explored: 0,
            unique: 0,
            max_depth: 0,
            ends: 0,
            pairs_checked: 0,
            fingerprints_checked: 0,
            secs: 0.0,
            reached: 0,
            witnesses: Vec::new(),
            violation: None,
        }
    }
}

/// A state being expanded.
struct Frame<M: Model> {
    state: Option<M>,
    /// Every action enabled in `state`.
    actions: Vec<M::Action>,
    /// The actions still to take from here.
    todo: Mask,
    /// The sleep set: actions whose subtrees from here are covered elsewhere, grown by
    /// each action taken.
    sleep: Mask,
    /// The action that led here (the trace is read off the stack).
    via: Option<M::Action>,
}

fn bits(n: usize) -> Mask {
    assert!(
        n <= MAX_ACTIONS,
        "more than {MAX_ACTIONS} actions in one state"
    );
    if n == MAX_ACTIONS {
        Mask::MAX
    } else {
        (1 << n) - 1
    }
}

/// Explores every state reachable from `root`; stops at the first violation, or (a
/// search, not a proof) once every "sometimes" bit of a non-zero `options.stop` is reached.
pub fn explore<M: Model>(root: M, options: Options) -> Report<M::Action> {
    let t0 = Instant::now();
    let mut report = Report::default();
    // Every state seen, with the actions not yet taken from it (its sleep set).
    let mut seen: HashMap<u64, Mask> = HashMap::new();
    // With `check_fingerprints`: each fingerprint's first whole state, hashed.
    let mut whole: HashMap<u64, u64> = HashMap::new();
    let show: Option<u64> = std::env::var("MODEL_FINGERPRINT_SHOW")
        .ok()
        .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok());
    let mut same_whole = |state: &M, fingerprint: u64, report: &mut Report<M::Action>| {
        if !options.check_fingerprints {
            return Ok(());
        }
        report.fingerprints_checked += 1;
        let rendered = state.full_state();
        if show == Some(fingerprint) {
            eprintln!("state of fingerprint {fingerprint:#x}:\n{rendered}");
        }
        let mut h = DefaultHasher::new();
        rendered.hash(&mut h);
        let h = h.finish();
        match whole.insert(fingerprint, h) {
            Some(first) if first != h => Err(format!(
                "fingerprint {fingerprint:#x} stands for two different whole states, the one \
                 this trace reaches and one reached before (a field the fingerprint leaves \
                 out?): MODEL_FINGERPRINT_SHOW={fingerprint:x} prints each state it stands for"
            )),
            _ => Ok(()),
        }
    };
    let trace = |stack: &[Frame<M>], last: &M::Action| -> Vec<M::Action> {
        let mut t: Vec<M::Action> = stack.iter().filter_map(|f| f.via.clone()).collect();
        t.push(last.clone());
        t
    };
    let mut stack: Vec<Frame<M>> = Vec::new();
    {
        let mut actions = Vec::new();
        root.actions(&mut actions);
        seen.insert(root.fingerprint(), 0);
        report.unique = 1;
        if let Err(v) = same_whole(&root, root.fingerprint(), &mut report) {
            report.violation = Some((v, Vec::new()));
            report.secs = t0.elapsed().as_secs_f64();
            return report;
        }
        if let Err(v) = first_visit(&root, &actions, options, &mut report) {
            report.violation = Some((v, Vec::new()));
            report.secs = t0.elapsed().as_secs_f64();
            return report;
        }
        record(&root, &mut report, Vec::new);
        let all = bits(actions.len());
        stack.push(Frame {
            state: Some(root),
            actions,
            todo: all,
            sleep: 0,
            via: None,
        });
    }
    while let Some(top) = stack.last_mut() {
        if top.todo == 0 {
            stack.pop();
            continue;
        }
        let i = top.todo.trailing_zeros() as usize;
        top.todo &= !(1 << i);
        let action = top.actions[i].clone();
        let parent = top.state.as_ref().expect("a state");
        // The child's sleep set: what sleeps here, and every sibling taken before this
        // one, that is independent of this action here.
        let mut asleep: Vec<M::Action> = Vec::new();
        if options.reduce {
            let mut s = top.sleep;
            while s != 0 {
                let j = s.trailing_zeros() as usize;
                s &= s - 1;
                if parent.independent(&top.actions[j], &action) {
                    asleep.push(top.actions[j].clone());
                }
            }
        }
        top.sleep |= 1 << i;
        let mut child = if top.todo == 0 {
            top.state.take().expect("a state")
        } else {
            parent.clone()
        };
        child.step(&action);
        report.explored += 1;
        if report.explored % 1_000_000 == 0 && std::env::var("MODEL_PROGRESS").is_ok() {
            eprintln!(
                "  ... {} explored, {} unique, depth {} (max {}), {:.0} s",
                report.explored,
                report.unique,
                stack.len(),
                report.max_depth,
                t0.elapsed().as_secs_f64()
            );
        }
        let fingerprint = child.fingerprint();
        if let Err(v) = same_whole(&child, fingerprint, &mut report) {
            report.violation = Some((v, trace(&stack, &action)));
            break;
        }
        let stored = seen.get(&fingerprint).copied();
        if stored == Some(0) {
            continue; // seen, and every action from it taken
        }
        let mut actions = Vec::new();
        child.actions(&mut actions);
        let all = bits(actions.len());
        let sleep = actions
            .iter()
            .enumerate()
            .filter(|(_, a)| asleep.contains(a))
            .fold(0, |m, (j, _)| m | (1 << j));
        let todo = match stored {
            Some(stored) => {
                // Seen: take only what its earlier visits left asleep and this one does not.
                let todo = stored & !sleep;
                seen.insert(fingerprint, stored & sleep);
                if todo == 0 {
                    continue;
                }
                todo
            }
            None => {
                seen.insert(fingerprint, sleep);
                report.unique += 1;
                let depth = stack.len();
                report.max_depth = report.max_depth.max(depth);
                assert!(depth < MAX_DEPTH, "the model is deeper than {MAX_DEPTH}");
                if let Err(v) = first_visit(&child, &actions, options, &mut report) {
                    report.violation = Some((v, trace(&stack, &action)));
                    break;
                }
                record(&child, &mut report, || trace(&stack, &action));
                if options.stop != 0 && report.reached & options.stop == options.stop {
                    break;
                }
                all & !sleep
            }
        };
        stack.push(Frame {
            state: Some(child),
            actions,
            todo,
            sleep,
            via: Some(action),
        });
    }
    report.secs = t0.elapsed().as_secs_f64();
    report
}

/// The checks of a state's first visit: its "always" properties, those of a finished
/// trace when it has no actions, and (when asked) the independence of its pairs.
fn first_visit<M: Model>(
    state: &M,
    actions: &[M::Action],
    options: Options,
    report: &mut Report<M::Action>,
) -> Result<(), String> {
    if let Some(v) = state.violation() {
        return Err(v);
    }
    if actions.is_empty() {
        report.ends += 1;
        if let Some(v) = state.at_end() {
            return Err(v);
        }
    }
    // Sampled by the count of states, not by fingerprint: fingerprints hash instants,
    // which differ from run to run, and a sampled failure must reproduce.
    let every = options.check_independence;
    if every != 0 && report.unique % every == 0 {
        for (i, a) in actions.iter().enumerate() {
            for b in &actions[i + 1..] {
                if !state.independent(a, b) {
                    continue;
                }
                report.pairs_checked += 1;
                let ab = then(state, a, b);
                let ba = then(state, b, a);
                match (ab, ba) {
                    (Some(x), Some(y)) if x == y => {}
                    (x, y) => {
                        return Err(format!(
                            "the model calls {a:?} and {b:?} independent here, but {}",
                            match (x, y) {
                                (None, _) => format!("{a:?} disables {b:?}"),
                                (_, None) => format!("{b:?} disables {a:?}"),
                                _ => "the two orders reach different states".into(),
                            }
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The fingerprint after `a` then `b`, or `None` if `a` disables `b`.
fn then<M: Model>(state: &M, a: &M::Action, b: &M::Action) -> Option<u64> {
    let mut s = state.clone();
    s.step(a);
    let mut next = Vec::new();
    s.actions(&mut next);
    if !next.contains(b) {
        return None;
    }
    s.step(b);
    Some(s.fingerprint())
}

/// Notes the "sometimes" bits `state` reaches first, with the trace that reached them.
fn record<M: Model>(state: &M, report: &mut Report<M::Action>, path: impl Fn() -> Vec<M::Action>) {
    let bits = state.reached() & !report.reached;
    if bits != 0 {
        report.reached |= bits;
        report.witnesses.push((bits, path()));
    }
}
