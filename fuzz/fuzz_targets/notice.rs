//! One subscriber connection's state machine (`Subscriber`) driven by a script of
//! connection events, wanted keys, server bytes and reads: no panic, every buffer within
//! its bound, the wanted keys as a model counts them; see `check_notice` for the input
//! layout and the properties.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| quorumlock_fuzz::check_notice(data));
