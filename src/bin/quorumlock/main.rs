//! `quorumlock`: run a command while holding a Redlock, like `flock(1)` across machines;
//! probe (`try`), inspect (`status`) or measure (`bench`) a lock service.
//! `quorumlock --help` (the text is in [`args::HELP`]) describes every option, the stop
//! rule and the exit codes.
//!
//! # Layout
//!
//! - `args.rs`: strict parsing, durations, the help text.
//! - `run.rs`: `run`: the command under a lease, the stop rule, signals forwarded.
//! - `probe.rs`: `try`, `status`, `bench`.
//! - `report.rs`: what `run` says when it stops the command (an observer of the
//!   lease's renewals), with RFC 3339 UTC timestamps.
//! - `sys.rs`: signals, process groups, the watchdog: the only `unsafe` code (denied
//!   everywhere else).

#![deny(unsafe_code)]

mod args;
mod probe;
mod report;
mod run;
mod sys;

use args::{Action, Parsed};
use quorumlock::{Error, Redlock};
use std::process::ExitCode;
use std::sync::Arc;

/// Bad arguments, settings or node URLs (sysexits `EX_USAGE`).
pub const EX_USAGE: u8 = 64;
/// Too few nodes answered for a majority (`EX_UNAVAILABLE`).
pub const EX_UNAVAILABLE: u8 = 69;
/// The lock was lost while the command ran (`EX_SOFTWARE`).
pub const EX_LOST: u8 = 70;
/// The operating system refused a fork, a pipe or a signal handler (`EX_OSERR`).
pub const EX_OSERR: u8 = 71;
/// Held by another client (`EX_TEMPFAIL`), unless `-E` says otherwise.
pub const EX_TEMPFAIL: u8 = args::DEFAULT_CONFLICT_CODE;

/// The exit code for a failed lock call; `conflict` when the lock is held by another
/// client (`-E`, by default [`EX_TEMPFAIL`]).
pub fn failure_code(e: &Error, conflict: u8) -> u8 {
    match e {
        Error::Taken(_) => conflict,
        Error::Unavailable(_) | Error::Expired(_) => EX_UNAVAILABLE,
        Error::InvalidArgument(_) | Error::Config(_) => EX_USAGE,
        _ => EX_OSERR,
    }
}

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("quorumlock: {msg}");
    eprintln!("try 'quorumlock --help'");
    ExitCode::from(EX_USAGE)
}

fn main() -> ExitCode {
    let argv: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect();
    let Ok(argv) = argv else {
        return usage_error("arguments must be valid UTF-8");
    };
    let env_nodes = std::env::var("QUORUMLOCK_NODES").ok();
    let args = match args::parse(&argv, env_nodes.as_deref()) {
        Ok(Parsed::Help) => {
            print!("{}", args::HELP);
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Version) => {
            println!("quorumlock {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Go(args)) => args,
        Err(msg) => return usage_error(&msg),
    };
    let builder = Redlock::builder()
        .nodes(&args.nodes)
        .node_timeout(args.node_timeout)
        .fencing(args.fencing)
        .restart_guard(args.restart_guard)
        .retry_count(args.retries)
        .retry_delay(args.retry_delay)
        .retry_jitter(args.retry_delay / 2);
    #[cfg(feature = "tls")]
    let builder = match tls_from_env(builder) {
        Ok(b) => b,
        Err(msg) => return usage_error(&msg),
    };
    // Every setting and URL is checked here, before anything connects or runs.
    let settings = match builder.clone().settings() {
        Ok(s) => s,
        Err(e) => return usage_error(&e.to_string()),
    };
    let code = match &args.action {
        Action::Run { resource, command } => {
            if let Err(msg) = run::check_rule(
                args.ttl,
                args.kill_after,
                args.node_timeout,
                settings.drift_factor,
            ) {
                return usage_error(&msg);
            }
            // The lease's rounds and the nodes' changes, for the stop report.
            let renewals = Arc::new(report::Renewals::default());
            let builder = builder.observer(Arc::clone(&renewals));
            run::run(&args, builder, &renewals, resource, command)
        }
        Action::Try { resource } => probe::try_once(builder, resource, &args),
        Action::Status { resource } => probe::status(&settings, resource),
        Action::Bench => probe::bench(builder, &args),
    };
    ExitCode::from(code)
}

/// The TLS settings from `QUORUMLOCK_TLS_CA_FILE`, `QUORUMLOCK_TLS_CERT` and
/// `QUORUMLOCK_TLS_KEY` (files are read when the settings are checked).
#[cfg(feature = "tls")]
fn tls_from_env(mut builder: quorumlock::Builder) -> Result<quorumlock::Builder, String> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(ca) = var("QUORUMLOCK_TLS_CA_FILE") {
        builder = builder.tls_ca_file(ca);
    }
    match (var("QUORUMLOCK_TLS_CERT"), var("QUORUMLOCK_TLS_KEY")) {
        (Some(cert), Some(key)) => builder = builder.tls_client_cert(cert, key),
        (None, None) => {}
        _ => return Err("QUORUMLOCK_TLS_CERT and QUORUMLOCK_TLS_KEY go together".into()),
    }
    Ok(builder)
}
