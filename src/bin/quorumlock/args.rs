//! The command line: strict parsing (options anywhere before `--`, `--opt value` or
//! `--opt=value`, the short `-n`, `-w S`, `-E N`), durations (a bare number is seconds,
//! fractions allowed, units accepted), node URLs from `--nodes`, `--nodes-file` or
//! `QUORUMLOCK_NODES`, and the help text.
//!
//! Every refusal here is a usage error (exit 64) whose message quotes the offending text,
//! except a node URL's password, which no message contains.

use quorumlock::__private::env::parse_duration;
use std::time::Duration;

/// What the command line asks for.
#[derive(Debug)]
pub enum Parsed {
    Help,
    Version,
    Go(Args),
}

/// How `run` (and `try` with `-w`) waits for a lock held by another client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// `-n`: one attempt (and `--retries` more).
    Once,
    /// `-w SECONDS`: until the lock is free or this long has passed.
    Within(Duration),
    /// The default of `run`: until the lock is free, or a signal.
    Forever,
}

/// A valid command line.
#[derive(Debug)]
pub struct Args {
    pub action: Action,
    /// The node URLs (checked when the client is built). May hold passwords: never
    /// printed.
    pub nodes: Vec<String>,
    pub ttl: Duration,
    pub wait: Wait,
    /// The exit code when the lock is held by another client (`-E`).
    pub conflict_code: u8,
    pub kill_after: Duration,
    pub node_timeout: Duration,
    pub retries: u32,
    pub retry_delay: Duration,
    pub fencing: bool,
    pub restart_guard: Duration,
    /// `bench`: how many locks, or for how long.
    pub count: u64,
    pub duration: Option<Duration>,
}

#[derive(Debug)]
pub enum Action {
    Run {
        resource: String,
        command: Vec<String>,
    },
    Try {
        resource: String,
    },
    Status {
        resource: String,
    },
    Bench,
}

pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(2);
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(200);
/// `-E`'s default: sysexits' `EX_TEMPFAIL`.
pub const DEFAULT_CONFLICT_CODE: u8 = 75;
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(200);
pub const DEFAULT_COUNT: u64 = 1000;

pub const HELP: &str = "\
quorumlock: run a command while holding a Redlock over N independent Redis masters
(a distributed flock(1)), probe or inspect a lock, or measure the nodes.

USAGE
  quorumlock [OPTIONS] run RESOURCE -- COMMAND [ARGS...]
  quorumlock [OPTIONS] try RESOURCE
  quorumlock [OPTIONS] status RESOURCE
  quorumlock [OPTIONS] bench [--count N | --duration DURATION]
  Options may stand anywhere before `--`, after the action too; everything after `--`
  is the command.

ACTIONS
  run RESOURCE -- COMMAND [ARGS...]
      Acquire RESOURCE, waiting until it is free (as flock and etcdctl lock do; -n: one
      attempt; -w SECONDS: at most that long), run COMMAND in its own process group
      while the lock is kept alive (extended every ttl/3), release it when COMMAND
      exits, and exit with COMMAND's status. SIGINT, SIGTERM and SIGHUP sent to
      quorumlock are forwarded to the command's process group; while waiting they end
      the wait (exit 128+N, nothing is run). Only a lock held by another client is
      waited for: a first attempt that finds too few nodes answering exits 69 at once;
      once waiting, nodes that stop answering are retried until the wait ends. A
      waiter is woken when the holder releases (a release notice), not by polling.
      COMMAND's environment gets QUORUMLOCK_RESOURCE, QUORUMLOCK_TOKEN_PREFIX (the
      token's first 8 characters; the whole token is never shown) and, with --fencing,
      QUORUMLOCK_FENCE (the lock's fencing token: pass it with every write the lock
      protects; a later holder's is larger).
  try RESOURCE
      One attempt to acquire RESOURCE, released at once: a probe. Prints one line on
      stdout when it got the lock (with its fence under --fencing); errors go to stderr.
  status RESOURCE
      One line per node on stdout: whether the key exists, its holder's token prefix
      (the first 8 characters, as QUORUMLOCK_TOKEN_PREFIX; never the whole token), its
      PTTL, the node's run_id and uptime; then a summary line. Exit 0 if one token is
      held on a majority of nodes, 1 otherwise.
  bench
      Acquire and release locks on keys `quorumlock:bench:<random>` one after the other
      against the nodes; a progress line on stderr, a table of p50/p99 latencies and
      locks/s on stdout. ^C (or SIGTERM, SIGHUP) stops it between two locks: the
      numbers so far are printed, nothing is left on the nodes, exit 128+N.

OPTIONS
  --nodes URL,URL,...    Redis masters: redis://[[user]:password@]host[:port][/db] or
                         unix:///path/to/redis.sock[?db=N], or over TLS (when built
                         with the tls feature) rediss://[[user]:password@]host[:port][/db];
                         overrides QUORUMLOCK_NODES. Passwords given here are visible
                         in ps: prefer --nodes-file or QUORUMLOCK_NODES for them
  --nodes-file PATH      the node URLs from a file, one per line; blank lines and lines
                         starting with # are skipped (overrides QUORUMLOCK_NODES; not
                         with --nodes). Errors name the line, never its password
  --ttl DURATION         lock ttl (default 30s); run extends it every ttl/3
  -n, --nonblock         run, try: one attempt; if the lock is held, exit at once with
                         the conflict code (try always makes one attempt)
  -w, --wait SECONDS     run: wait at most this long for the lock (fractions allowed:
                         -w 2.5), then exit with the conflict code; without -n or -w,
                         run waits until it gets the lock (or a signal)
  -E, --conflict-exit-code N
                         run, try: the exit code when the lock is held by another
                         client (default 75)
  --node-timeout DURATION
                         longest a round waits for a node's reply (default 200ms); set
                         it above the network's round trip to the nodes
  --kill-after DURATION  run: SIGKILL this long after the SIGTERM that stops the command
                         (default 2s; 0 sends SIGKILL at once)
  --fencing              fenced locks: every acquire gets a fencing token, larger than
                         every earlier holder's (default off; see QUORUMLOCK_FENCE)
  --restart-guard DURATION
                         a node that restarted (or failed over) less than this long ago
                         does not vote yet: set it to the ttl unless the nodes persist
                         every write (default 0: off)
  --retries N            run -n: extra attempts, --retry-delay apart (default 0)
  --retry-delay DURATION mean delay between attempts while waiting, or of --retries
                         (default 200ms)
  --count N              bench: locks to take (default 1000)
  --duration DURATION    bench: run for this long instead of --count
  -h, --help             this help
  -V, --version          the version

  DURATION (and SECONDS) is a number of seconds, fractions allowed (5, 0.5, 2.5), or a
  number with a unit: us, ms, s, m or h (250ms, 1.5s, 2m, 1h). A bad value is a usage
  error (64) that quotes it. --timeout is gone: use --node-timeout for the per-node
  timeout, -w for the wait.

THE STOP RULE (run)
  The command is stopped (SIGTERM to its process group, SIGKILL --kill-after later) when
  the lock is lost, or when its remaining validity falls to the stop line
      kill-after + node-timeout + (kill-after + node-timeout) / 4
  so that the SIGKILL lands before the lock's local validity deadline with
  node-timeout + (kill-after + node-timeout) / 4 to spare. Should quorumlock wake late
  (a loaded machine) or the deadline move earlier, the SIGKILL comes sooner than
  --kill-after rather than later: never with less than that spare left, and at once
  when none is. A healthy lock never gets there: it is extended every ttl/3, when about
  2/3 of the ttl (less the drift allowance ttl/100 + 2ms) remains.
  Settings are refused (exit 64) unless --ttl >= 3 x (kill-after + node-timeout), or at
  least 2/3 x ttl - drift >= 1.5 x (kill-after + node-timeout); the message names every
  way out: a longer --ttl, a shorter --kill-after, a shorter --node-timeout.

  When it stops the command, quorumlock says why on stderr, each line stamped with the
  time in RFC 3339 UTC (2026-01-31T12:00:00.123Z): the lock lost or its validity at
  the stop line, when the last renewal a majority confirmed was, and for each node
  whose renewals failed, since when and the last reason (no reply, refused, down).

  When the command exits, anything it left running in its process group gets SIGTERM
  and, kill-after later, SIGKILL, before the lock is released. If quorumlock itself is
  killed (kill -9), the command gets SIGKILL from the kernel (parent-death signal) and
  its whole process group from a watchdog process. Processes that left the group
  (setsid, setpgid) are not stopped in any of these cases. The command runs in the
  background of a terminal: it cannot read from it. quorumlock ignores ^Z (SIGTSTP,
  SIGTTIN, SIGTTOU): stopped, it could neither keep the lock nor stop the command.
  Should quorumlock be stopped anyway (SIGSTOP to it or to its job's process group) or
  stall, the watchdog, in a process group of its own, kills the command's group by
  itself half the spare before the deadline (exit 70 once resumed). A command that
  ended on its own meanwhile keeps its status if the watchdog saw it end in time (on
  Linux, by a pidfd; else 70). Both paused together (a cgroup freeze, a suspended
  machine) is beyond it.

EXIT STATUS
  0        try: got the lock; status: one token held on a majority; bench: done
  N        run: the command's own status; 128+N if it was killed by signal N
  1        status: no token held on a majority
  64       usage error: bad arguments, settings, node URLs or --nodes-file (nothing
           was run)
  69       lock service unavailable: too few nodes answered for a majority
  70       run: the lock was lost (or ran too low) while the command ran; it was stopped
  71       operating-system error (fork, pipe, signals)
  75       held by another client: with -n at once, with -w when the time is up (-E
           sets another code)
  126      run: the command is not executable
  127      run: the command was not found
  128+N    run: quorumlock got signal N while waiting for the lock (nothing was run);
           bench: stopped by signal N

ENVIRONMENT
  QUORUMLOCK_NODES       comma-separated node URLs, used when neither --nodes nor
                         --nodes-file is given
  With the tls feature, for rediss:// nodes:
  QUORUMLOCK_TLS_CA_FILE PEM file of CA certificates, the only ones trusted when set;
                         else the system's bundle (SSL_CERT_FILE, else
                         /etc/ssl/certs/ca-certificates.crt, ...)
  QUORUMLOCK_TLS_CERT, QUORUMLOCK_TLS_KEY
                         client certificate and private key (PEM) for mutual TLS: both
                         or neither
  Set for COMMAND by run: QUORUMLOCK_RESOURCE, QUORUMLOCK_TOKEN_PREFIX and, with
  --fencing, QUORUMLOCK_FENCE (removed when not fenced, so a nested run does not pass
  on an outer one's).

EXAMPLES
  export QUORUMLOCK_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379
  quorumlock --ttl 1m run nightly-report -- ./make-report.sh --full    # waits for it
  quorumlock -n run nightly-report -- ./make-report.sh                 # or gives up: 75
  quorumlock -w 2.5 -E 0 run cron-job -- ./job.sh      # skip quietly if held for 2.5 s
  quorumlock --nodes-file /etc/quorumlock/nodes --fencing run ledger -- \\
      sh -c 'write-ledger --fence \"$QUORUMLOCK_FENCE\"'
";

/// Every option that takes a value, long and short names.
const VALUED: [&str; 15] = [
    "--nodes",
    "--nodes-file",
    "--ttl",
    "--wait",
    "-w",
    "--conflict-exit-code",
    "-E",
    "--kill-after",
    "--node-timeout",
    "--retries",
    "--retry-delay",
    "--restart-guard",
    "--count",
    "--duration",
    "--timeout",
];

/// Every option that takes no value.
const FLAGS: [&str; 3] = ["--nonblock", "-n", "--fencing"];

/// The long name of an option given by its short one, for messages and checks.
fn long(name: &str) -> &str {
    match name {
        "-w" => "--wait",
        "-E" => "--conflict-exit-code",
        "-n" => "--nonblock",
        other => other,
    }
}

/// Parses `argv` (without the program name); `env_nodes` is `QUORUMLOCK_NODES`.
/// `--nodes-file` is read here.
pub fn parse(argv: &[String], env_nodes: Option<&str>) -> Result<Parsed, String> {
    let mut positional: Vec<&str> = Vec::new();
    let mut command: Option<Vec<String>> = None;
    let mut nodes: Option<String> = None;
    let mut nodes_file: Option<String> = None;
    let mut ttl = DEFAULT_TTL;
    let mut wait: Option<Duration> = None;
    let mut nonblock = false;
    let mut conflict_code = DEFAULT_CONFLICT_CODE;
    let mut kill_after = DEFAULT_KILL_AFTER;
    let mut node_timeout = DEFAULT_NODE_TIMEOUT;
    let mut retries = 0u32;
    let mut retry_delay = DEFAULT_RETRY_DELAY;
    let mut fencing = false;
    let mut restart_guard = Duration::ZERO;
    let mut count: Option<u64> = None;
    let mut duration: Option<Duration> = None;
    let mut given: Vec<&str> = Vec::new();

    let mut i = 0;
    while i < argv.len() {
        let arg = argv[i].as_str();
        i += 1;
        if arg == "--" {
            command = Some(argv[i..].to_vec());
            break;
        }
        if arg == "-h" || arg == "--help" {
            return Ok(Parsed::Help);
        }
        if arg == "-V" || arg == "--version" {
            return Ok(Parsed::Version);
        }
        if !arg.starts_with('-') || arg == "-" {
            positional.push(arg);
            continue;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            // `-w0.5`, `-E3`: a short option with its value attached.
            _ if (arg.starts_with("-w") || arg.starts_with("-E")) && arg.len() > 2 => {
                (&arg[..2], Some(arg[2..].to_string()))
            }
            _ => (arg, None),
        };
        if name == "--timeout" {
            return Err(
                "--timeout is gone: the per-node timeout is --node-timeout DURATION; \
                 to bound the wait for the lock use -w, --wait SECONDS"
                    .into(),
            );
        }
        if FLAGS.contains(&name) {
            if let Some(v) = inline {
                return Err(format!("{name} takes no value (got {v:?})"));
            }
            given.push(long(name));
            match name {
                "--fencing" => fencing = true,
                _ => nonblock = true,
            }
            continue;
        }
        if !VALUED.contains(&name) {
            return Err(format!("unknown option {arg:?}"));
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let v = argv
                    .get(i)
                    .filter(|v| v.as_str() != "--")
                    .ok_or_else(|| format!("{name} needs a value"))?;
                i += 1;
                v.clone()
            }
        };
        let name = long(name);
        given.push(name);
        match name {
            "--nodes" => nodes = Some(value),
            "--nodes-file" => nodes_file = Some(value),
            "--ttl" => ttl = nonzero(name, duration_arg(name, &value)?)?,
            "--wait" => wait = Some(duration_arg(name, &value)?),
            "--kill-after" => kill_after = duration_arg(name, &value)?,
            "--node-timeout" => node_timeout = nonzero(name, duration_arg(name, &value)?)?,
            "--retry-delay" => retry_delay = nonzero(name, duration_arg(name, &value)?)?,
            "--restart-guard" => restart_guard = duration_arg(name, &value)?,
            "--conflict-exit-code" => {
                conflict_code = value
                    .parse()
                    .map_err(|_| format!("{name}: {value:?} is not an exit code from 0 to 255"))?
            }
            "--retries" => {
                retries = value.parse().map_err(|_| {
                    format!(
                        "{name}: {value:?} is not a whole number from 0 to {}",
                        u32::MAX
                    )
                })?
            }
            "--count" => {
                count = Some(
                    value
                        .parse()
                        .ok()
                        .filter(|&n: &u64| n > 0)
                        .ok_or_else(|| format!("{name}: {value:?} is not a positive number"))?,
                )
            }
            _ => duration = Some(nonzero(name, duration_arg(name, &value)?)?),
        }
    }

    let (action, rest) = match positional.split_first() {
        None => return Err("missing action (run, try, status or bench)".into()),
        Some((&"bench", rest)) => (Action::Bench, rest),
        Some((&verb @ ("run" | "try" | "status"), rest)) => {
            let Some((resource, rest)) = rest.split_first() else {
                return Err(format!("{verb}: missing RESOURCE"));
            };
            let resource = resource.to_string();
            let action = match verb {
                "run" => {
                    let command = command
                        .take()
                        .ok_or("run: missing `-- COMMAND` (everything after -- is the command)")?;
                    if command.is_empty() {
                        return Err("run: missing COMMAND after --".into());
                    }
                    Action::Run { resource, command }
                }
                "try" => Action::Try { resource },
                _ => Action::Status { resource },
            };
            (action, rest)
        }
        Some((other, _)) => {
            return Err(format!(
                "unknown action {other:?} (expected run, try, status or bench)"
            ));
        }
    };
    if let Some(extra) = rest.first() {
        return Err(format!("unexpected argument {extra:?}"));
    }
    if command.is_some() {
        return Err("only run takes a command after --".into());
    }
    let only = |opts: &[&str], verb: &str, ok: bool| -> Result<(), String> {
        match given.iter().find(|g| opts.contains(g)) {
            Some(opt) if !ok => Err(format!("{opt} is only for {verb}")),
            _ => Ok(()),
        }
    };
    let is_run = matches!(action, Action::Run { .. });
    only(
        &["--count", "--duration"],
        "bench",
        matches!(action, Action::Bench),
    )?;
    only(&["--wait", "--kill-after", "--retries"], "run", is_run)?;
    only(
        &["--nonblock", "--conflict-exit-code"],
        "run and try",
        is_run || matches!(action, Action::Try { .. }),
    )?;
    if count.is_some() && duration.is_some() {
        return Err("give --count or --duration, not both".into());
    }
    if nonblock && wait.is_some() {
        return Err("give -n (one attempt) or -w SECONDS (wait that long), not both".into());
    }
    if given.contains(&"--retries") && !nonblock {
        return Err(
            "--retries counts the extra attempts of -n: without -n, run keeps \
             trying until it gets the lock (or -w's time is up)"
                .into(),
        );
    }
    let wait = match (is_run, nonblock, wait) {
        (true, false, None) => Wait::Forever,
        (_, _, Some(w)) => Wait::Within(w),
        _ => Wait::Once,
    };

    let nodes: Vec<String> = match (nodes, nodes_file) {
        (Some(_), Some(_)) => return Err("give --nodes or --nodes-file, not both".into()),
        (Some(list), None) => split_nodes(&list),
        (None, Some(path)) => read_nodes_file(&path)?,
        (None, None) => split_nodes(env_nodes.unwrap_or("")),
    };
    if nodes.is_empty() {
        return Err(
            "no nodes: give --nodes URL,URL,... or --nodes-file PATH, or set QUORUMLOCK_NODES"
                .into(),
        );
    }
    Ok(Parsed::Go(Args {
        action,
        nodes,
        ttl,
        wait,
        conflict_code,
        kill_after,
        node_timeout,
        retries,
        retry_delay,
        fencing,
        restart_guard,
        count: count.unwrap_or(DEFAULT_COUNT),
        duration,
    }))
}

/// `URL,URL,...` (`--nodes`, `QUORUMLOCK_NODES`): blanks around each ignored.
fn split_nodes(list: &str) -> Vec<String> {
    // The library's rule: commas or spaces, a password's comma kept in its URL.
    quorumlock::__private::env::split_node_list(list)
}

/// The node URLs of `--nodes-file PATH`: one per line, taken whole (a password may hold
/// a comma), blank lines and lines starting with `#` skipped. Each is checked here, so
/// that a bad one is named by its line; no message quotes a line (it may hold a
/// password), only its number and what is wrong.
fn read_nodes_file(path: &str) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--nodes-file {path:?}: cannot read it: {e}"))?;
    let mut urls = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let url = line.trim();
        if url.is_empty() || url.starts_with('#') {
            continue;
        }
        if let Err(e) = quorumlock::Endpoint::parse(url) {
            let why = scrub(&e.problem, url);
            return Err(format!(
                "--nodes-file {path:?} line {}: not a node URL: {why}",
                n + 1
            ));
        }
        urls.push(url.to_string());
    }
    if urls.is_empty() {
        return Err(format!("--nodes-file {path:?} holds no node URL"));
    }
    Ok(urls)
}

/// `text` without anything of `url`'s login (user and password) in it: a guard on top
/// of the library's masking, for a line malformed enough to fool it.
fn scrub(text: &str, url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let login = rest.rfind('@').map_or("", |at| &rest[..at]);
    let mut out = text.to_string();
    for secret in [login, login.split_once(':').map_or("", |(_, pw)| pw)] {
        if !secret.is_empty() {
            out = out.replace(secret, "***");
        }
    }
    out
}

fn duration_arg(name: &str, value: &str) -> Result<Duration, String> {
    parse_duration(value).ok_or_else(|| {
        format!(
            "{name}: {value:?} is not a duration (seconds, fractions allowed: 5, 0.5; or a \
             number with a unit: us, ms, s, m, h, as in 250ms, 1.5m)"
        )
    })
}

fn nonzero(name: &str, d: Duration) -> Result<Duration, String> {
    if d.is_zero() {
        Err(format!("{name} must be more than zero"))
    } else {
        Ok(d)
    }
}

/// A duration as a person writes it: `2s`, `1.5s`, `750ms`, `0s`.
pub fn show(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        let ms = d.as_millis();
        if ms % 1000 == 0 {
            format!("{}s", ms / 1000)
        } else {
            format!("{:.3}s", d.as_secs_f64())
        }
    } else if d >= Duration::from_millis(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}us", d.as_micros())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn go(s: &str) -> Args {
        match parse(&args(s), Some("redis://127.0.0.1:1")) {
            Ok(Parsed::Go(a)) => a,
            other => panic!("{s}: {other:?}"),
        }
    }

    fn err(s: &str) -> String {
        match parse(&args(s), Some("redis://127.0.0.1:1")) {
            Err(e) => e,
            other => panic!("{s}: expected an error, got {other:?}"),
        }
    }

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("500ms"), Some(ms(500)));
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250us"), Some(Duration::from_micros(250)));
        // A bare number is seconds, fractions allowed, with or without a unit.
        assert_eq!(parse_duration("5"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("1500"), Some(Duration::from_secs(1500)));
        assert_eq!(parse_duration("0.5"), Some(ms(500)));
        assert_eq!(parse_duration("2.5"), Some(ms(2500)));
        assert_eq!(parse_duration("1.5s"), Some(ms(1500)));
        assert_eq!(parse_duration("1.5m"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("0.25ms"), Some(Duration::from_micros(250)));
        assert_eq!(parse_duration("0.000000001"), Some(Duration::from_nanos(1)));
        assert_eq!(
            parse_duration("0.0000000019"),
            Some(Duration::from_nanos(1))
        );
        assert_eq!(
            parse_duration("1.333333333333333333333333333h"),
            Some(Duration::from_nanos(4_799_999_999_999))
        );
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("0.0"), Some(Duration::ZERO));
        for bad in [
            "",
            "s",
            "10x",
            "-5",
            "+5",
            ".5",
            "5.",
            "1.5.2",
            "1e3",
            " 5",
            "5 s",
            "10S",
            "0x10",
            "99999999999999999999999999999999999999999",
            "18446744073709551616",
            "18446744073709551615h",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn waiting_flags() {
        let run = "run x -- true";
        assert_eq!(go(run).wait, Wait::Forever);
        assert_eq!(go(&format!("-n {run}")).wait, Wait::Once);
        assert_eq!(go(run).conflict_code, 75);
        assert_eq!(
            go(&format!("--nonblock {run}")).wait,
            go(&format!("-n {run}")).wait
        );
        assert_eq!(
            go("run x -w 2.5 -- true").wait,
            Wait::Within(Duration::from_millis(2500))
        );
        assert_eq!(
            go("run x -w0.5 -- true").wait,
            Wait::Within(Duration::from_millis(500))
        );
        assert_eq!(
            go("run x --wait=3 -- true").wait,
            Wait::Within(Duration::from_secs(3))
        );
        assert_eq!(go("run x -E 3 -n -- true").conflict_code, 3);
        assert_eq!(go("run x -E0 -- true").conflict_code, 0);
        assert_eq!(go("try x --conflict-exit-code=9").conflict_code, 9);
        assert_eq!(go("try x").wait, Wait::Once);
        assert_eq!(go("try x -n").wait, Wait::Once);
        assert_eq!(go("-n --retries 2 run x -- true").retries, 2);
        assert!(err("run x -n -w 1 -- true").contains("not both"));
        assert!(err("run x -E 256 -- true").contains("\"256\" is not an exit code"));
        assert!(err("run x -E -1 -- true").contains("\"-1\""));
        assert!(err("run x -w soon -- true").contains("\"soon\" is not a duration"));
        assert!(err("run x --retries 2 -- true").contains("-n"));
        assert!(err("try x -w 1").contains("only for run"));
        assert!(err("status x -n").contains("only for run and try"));
        assert!(err("run x -n=1 -- true").contains("unknown option"));
        assert!(err("run x --fencing=yes -- true").contains("takes no value"));
    }

    #[test]
    fn every_duration_reads_bare_numbers_as_seconds() {
        let a = go(
            "--ttl 5 --kill-after 0.5 --node-timeout 0.25 --retry-delay 0.1 \
                    --restart-guard 60 run x -- true",
        );
        assert_eq!(a.ttl, Duration::from_secs(5));
        assert_eq!(a.kill_after, Duration::from_millis(500));
        assert_eq!(a.node_timeout, Duration::from_millis(250));
        assert_eq!(a.retry_delay, Duration::from_millis(100));
        assert_eq!(a.restart_guard, Duration::from_secs(60));
        assert!(!a.fencing);
        assert!(go("--fencing try x").fencing);
        assert_eq!(
            go("bench --duration 1.5").duration,
            Some(Duration::from_millis(1500))
        );
        for opt in ["--ttl", "--kill-after", "--node-timeout", "--restart-guard"] {
            let e = err(&format!("run x {opt} 5q -- true"));
            assert!(e.contains(opt) && e.contains("\"5q\""), "{e}");
        }
    }

    #[test]
    fn the_old_timeout_flag_names_its_replacements() {
        for line in ["try x --timeout 1", "--timeout=2s run x -- true"] {
            let e = err(line);
            assert!(e.contains("--node-timeout") && e.contains("-w"), "{e}");
        }
    }

    #[test]
    fn nodes_files() {
        let dir = std::env::temp_dir().join(format!("quorumlock-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let good = file(
            "good",
            "# the three masters\n\n  redis://:pw,with,commas@127.0.0.1:7001  \n\
             \t# a comment\nredis://127.0.0.1:7002\nunix:///tmp/r.sock\n",
        );
        let a = parse(
            &args(&format!("--nodes-file {good} try x")),
            Some("http://x"),
        )
        .unwrap();
        let Parsed::Go(a) = a else { panic!() };
        assert_eq!(
            a.nodes,
            [
                "redis://:pw,with,commas@127.0.0.1:7001",
                "redis://127.0.0.1:7002",
                "unix:///tmp/r.sock"
            ]
        );
        let bad = file(
            "bad",
            "redis://127.0.0.1:7001\n# x\nredis://app:s3cr3t@127.0.0.1:99999\n",
        );
        let e = err(&format!("--nodes-file {bad} try x"));
        assert!(e.contains("line 3") && !e.contains("s3cr3t"), "{e}");
        let bad = file("scheme", "\nhttp://app:s3cr3t@host\n");
        let e = err(&format!("--nodes-file {bad} try x"));
        assert!(e.contains("line 2") && !e.contains("s3cr3t"), "{e}");
        let empty = file("empty", "# nothing\n\n");
        assert!(err(&format!("--nodes-file {empty} try x")).contains("no node URL"));
        let missing = dir.join("missing").display().to_string();
        let e = err(&format!("--nodes-file {missing} try x"));
        assert!(e.contains("cannot read") && e.contains(&missing), "{e}");
        assert!(err(&format!("--nodes-file {good} --nodes redis://h try x")).contains("not both"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn options_stand_anywhere_before_the_command() {
        let a = go("try x --ttl 5s");
        assert_eq!(a.ttl, Duration::from_secs(5));
        let a = go("--ttl=7s run x --wait 1s -- sh -c --ttl");
        assert_eq!(a.ttl, Duration::from_secs(7));
        assert_eq!(a.wait, Wait::Within(Duration::from_secs(1)));
        match a.action {
            Action::Run { command, .. } => assert_eq!(command, args("sh -c --ttl")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nodes_flag_overrides_the_environment() {
        let a = go("--nodes redis://127.0.0.1:2 status x");
        assert_eq!(a.nodes, ["redis://127.0.0.1:2"]);
        assert!(parse(&args("try x"), None).is_err());
    }

    #[test]
    fn strict() {
        assert!(err("try x y").contains("unexpected argument"));
        assert!(err("try").contains("missing RESOURCE"));
        assert!(err("run x sh").contains("missing `-- COMMAND`"));
        assert!(err("run x --").contains("missing COMMAND"));
        assert!(err("try x --ttl").contains("needs a value"));
        assert!(err("try x --ttl -- y").contains("needs a value"));
        assert!(err("try x --bogus 1").contains("unknown option"));
        assert!(err("try x --ttl soon").contains("not a duration"));
        assert!(err("try x --ttl 0").contains("more than zero"));
        assert!(err("try x --node-timeout 0.0").contains("more than zero"));
        assert!(err("try x -- y").contains("only run"));
        assert!(err("frob x").contains("unknown action"));
        assert!(err("").contains("missing action"));
        assert!(err("try x --count 5").contains("only for bench"));
        assert!(err("bench --wait 5").contains("only for run"));
        assert!(err("bench --count 0").contains("positive"));
        assert!(err("--retries -1 run x -n -- y").contains("whole number"));
    }

    #[test]
    fn help_and_version() {
        assert!(matches!(parse(&args("--help"), None), Ok(Parsed::Help)));
        assert!(matches!(parse(&args("try x -h"), None), Ok(Parsed::Help)));
        assert!(matches!(parse(&args("-V"), None), Ok(Parsed::Version)));
    }

    #[test]
    fn shown_durations() {
        assert_eq!(show(Duration::from_secs(2)), "2s");
        assert_eq!(show(Duration::from_millis(1500)), "1.500s");
        assert_eq!(show(Duration::from_millis(20)), "20ms");
    }
}
