//! `quorumlock`: run a command while holding a Redlock, like `flock(1)` across machines.
//!
//! ```text
//! quorumlock [OPTIONS] run RESOURCE -- COMMAND [ARGS...]
//! quorumlock [OPTIONS] try RESOURCE
//!
//! OPTIONS
//!   --nodes URL,URL,...   Redis masters (or env QUORUMLOCK_NODES)
//!   --ttl MS              lock ttl in ms (default 10000); `run` extends it every ttl/3
//!   --timeout MS          per-round node timeout in ms (default 50)
//!   --retries N           extra attempts to acquire (default 3)
//!   --retry-delay MS      mean delay between attempts (default 200)
//! ```
//!
//! `run` exits with the command's status; with 75 (EX_TEMPFAIL) if the lock could not be
//! taken; and kills the command (SIGTERM via `kill`) and exits 75 if the lock is lost
//! while it runs. `try` takes the lock once, prints the outcome and releases it.

use quorumlock::{Error, Redlock};
use std::process::{Command, ExitCode};
use std::time::Duration;

const USAGE: &str = "usage: quorumlock [--nodes URL,...] [--ttl MS] [--timeout MS] [--retries N] [--retry-delay MS] \
                     (run RESOURCE -- COMMAND [ARGS...] | try RESOURCE)";
const EX_USAGE: u8 = 64;
const EX_TEMPFAIL: u8 = 75;

struct Args {
    nodes: Vec<String>,
    ttl: Duration,
    timeout: Duration,
    retries: u32,
    retry_delay: Duration,
    action: Action,
}

enum Action {
    Run {
        resource: String,
        command: Vec<String>,
    },
    Try {
        resource: String,
    },
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut nodes = std::env::var("QUORUMLOCK_NODES").unwrap_or_default();
    let (mut ttl, mut timeout, mut retries, mut delay) = (10_000u64, 50u64, 3u32, 200u64);
    let number = |flag: &str, v: Option<String>| -> Result<u64, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse()
            .map_err(|_| format!("{flag}: {v:?} is not a number"))
    };
    loop {
        let Some(arg) = argv.next() else {
            return Err("missing action (run or try)".into());
        };
        match arg.as_str() {
            "--nodes" => nodes = argv.next().ok_or("--nodes needs a value")?,
            "--ttl" => ttl = number("--ttl", argv.next())?,
            "--timeout" => timeout = number("--timeout", argv.next())?,
            "--retries" => retries = number("--retries", argv.next())?.min(u32::MAX as u64) as u32,
            "--retry-delay" => delay = number("--retry-delay", argv.next())?,
            "-h" | "--help" => return Err(String::new()),
            "run" | "try" => {
                let resource = argv.next().ok_or("missing RESOURCE")?;
                let action = if arg == "try" {
                    Action::Try { resource }
                } else {
                    if argv.next().as_deref() != Some("--") {
                        return Err("expected -- before the command".into());
                    }
                    let command: Vec<String> = argv.collect();
                    if command.is_empty() {
                        return Err("missing COMMAND".into());
                    }
                    Action::Run { resource, command }
                };
                let nodes: Vec<String> = nodes
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect();
                return Ok(Args {
                    nodes,
                    ttl: Duration::from_millis(ttl),
                    timeout: Duration::from_millis(timeout),
                    retries,
                    retry_delay: Duration::from_millis(delay),
                    action,
                });
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("quorumlock: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(if msg.is_empty() { 0 } else { EX_USAGE });
        }
    };
    let built = Redlock::builder()
        .nodes(&args.nodes)
        .node_timeout(args.timeout)
        .retry_count(args.retries)
        .retry_delay(args.retry_delay)
        .retry_jitter(args.retry_delay / 2)
        .build();
    let mut rl = match built {
        Ok(rl) => rl,
        Err(e) => {
            eprintln!("quorumlock: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    match args.action {
        Action::Try { resource } => match rl.try_lock(&resource, args.ttl) {
            Ok(lock) => {
                println!(
                    "acquired {resource} (validity {:?}); releasing",
                    lock.remaining()
                );
                let _ = rl.unlock(&lock);
                ExitCode::SUCCESS
            }
            Err(e @ (Error::Config(_) | Error::InvalidArgument(_))) => {
                eprintln!("quorumlock: {e}");
                ExitCode::from(EX_USAGE)
            }
            Err(e) => {
                println!("{e}");
                ExitCode::from(EX_TEMPFAIL)
            }
        },
        Action::Run { resource, command } => run(&mut rl, &resource, &command, args.ttl),
    }
}

fn run(rl: &mut Redlock, resource: &str, command: &[String], ttl: Duration) -> ExitCode {
    let mut lock = match rl.lock(resource, ttl) {
        Ok(lock) => lock,
        Err(e @ (Error::Config(_) | Error::InvalidArgument(_))) => {
            eprintln!("quorumlock: {e}");
            return ExitCode::from(EX_USAGE);
        }
        Err(e) => {
            eprintln!("quorumlock: {e}");
            return ExitCode::from(EX_TEMPFAIL);
        }
    };
    let mut child = match Command::new(&command[0]).args(&command[1..]).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("quorumlock: cannot start {:?}: {e}", command[0]);
            let _ = rl.unlock(&lock);
            return ExitCode::from(127);
        }
    };
    let beat = (ttl / 3).max(Duration::from_millis(1));
    let status = loop {
        // Poll the child often, extend every ttl/3.
        let until = std::time::Instant::now() + beat;
        while std::time::Instant::now() < until {
            if let Ok(Some(status)) = child.try_wait() {
                let _ = rl.unlock(&lock);
                return ExitCode::from(exit_code(status));
            }
            std::thread::sleep(Duration::from_millis(10).min(beat));
        }
        if let Err(e) = rl.extend(&mut lock, ttl) {
            eprintln!(
                "quorumlock: lock lost while {:?} ran, stopping it: {e}",
                command[0]
            );
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            break child.wait();
        }
    };
    let _ = rl.unlock(&lock);
    let _ = status;
    ExitCode::from(EX_TEMPFAIL)
}

/// The command's exit status as a shell reports it: its code, or 128 + the signal that
/// killed it.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => (128 + signal) as u8,
        (None, None) => 128,
    }
}
