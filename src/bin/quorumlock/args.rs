//! The command line: strict parsing (options anywhere before `--`, `--opt value` or
//! `--opt=value`), durations with units, and the help text.

use std::time::Duration;

/// What the command line asks for.
#[derive(Debug)]
pub enum Parsed {
    Help,
    Version,
    Go(Args),
}

/// A valid command line.
#[derive(Debug)]
pub struct Args {
    pub action: Action,
    /// The node URLs as given (checked when the client is built).
    pub nodes: Vec<String>,
    pub ttl: Duration,
    pub wait: Duration,
    pub kill_after: Duration,
    pub timeout: Duration,
    pub retries: u32,
    pub retry_delay: Duration,
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
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(200);
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
  Options may stand anywhere before `--`; everything after `--` is the command.

ACTIONS
  run RESOURCE -- COMMAND [ARGS...]
      Acquire RESOURCE (waiting up to --wait), run COMMAND in its own process group while
      the lock is kept alive (extended every ttl/3), release it when COMMAND exits, and
      exit with COMMAND's status. SIGINT, SIGTERM and SIGHUP sent to quorumlock are
      forwarded to the command's process group.
  try RESOURCE
      One attempt to acquire RESOURCE, released at once: a probe. Prints one line on
      stdout when it got the lock; errors go to stderr.
  status RESOURCE
      One line per node on stdout: whether the key exists, its holder's token, its PTTL,
      the node's run_id and uptime; then a summary line. Exit 0 if one token is held on
      a majority of nodes, 1 otherwise.
  bench
      Acquire and release locks on keys `quorumlock:bench:<random>` one after the other
      against the nodes; a progress line on stderr, a table of p50/p99 latencies and
      locks/s on stdout. ^C (or SIGTERM, SIGHUP) stops it between two locks: the
      numbers so far are printed, nothing is left on the nodes, exit 128+N.

OPTIONS
  --nodes URL,URL,...    Redis masters: redis://[[user]:password@]host[:port][/db] or
                         unix:///path/to/redis.sock[?db=N], or over TLS (when built
                         with the tls feature) rediss://[[user]:password@]host[:port][/db];
                         overrides QUORUMLOCK_NODES
  --ttl DURATION         lock ttl (default 30s); run extends it every ttl/3
  --wait DURATION        run: keep trying to acquire for this long, woken when the holder
                         releases (default 0: one attempt, like flock -n)
  --retries N            run with --wait 0: extra attempts, --retry-delay apart (default 0)
  --retry-delay DURATION mean delay between attempts (default 200ms)
  --timeout DURATION     node timeout: longest a round waits for replies (default 200ms)
  --kill-after DURATION  run: SIGKILL this long after the SIGTERM that stops the command
                         (default 2s; 0 sends SIGKILL at once)
  --count N              bench: locks to take (default 1000)
  --duration DURATION    bench: run for this long instead of --count
  -h, --help             this help
  -V, --version          the version

  DURATION is a whole number with a unit: us, ms, s, m or h (500ms, 10s, 2m); a bare
  number is milliseconds.

THE STOP RULE (run)
  The command is stopped (SIGTERM to its process group, SIGKILL --kill-after later) when
  the lock is lost, or when its remaining validity falls to the stop line
      kill-after + timeout + (kill-after + timeout) / 4
  so that the SIGKILL lands before the lock's local validity deadline with
  timeout + (kill-after + timeout) / 4 to spare. Should quorumlock wake late (a loaded
  machine) or the deadline move earlier, the SIGKILL comes sooner than --kill-after
  rather than later: never with less than that spare left, and at once when none is.
  A healthy lock never gets there: it is extended every ttl/3, when about 2/3 of the
  ttl (less the drift allowance ttl/100 + 2ms) remains.
  Settings are refused (exit 64) unless --ttl >= 3 x (kill-after + timeout), or at least
  2/3 x ttl - drift >= 1.5 x (kill-after + timeout).

  When the command exits, anything it left running in its process group gets SIGTERM
  and, kill-after later, SIGKILL, before the lock is released. If quorumlock itself is
  killed (kill -9), the command gets SIGKILL from the kernel (parent-death signal) and
  its whole process group from a watchdog process. Processes that left the group
  (setsid, setpgid) are not stopped in any of these cases. The command runs in the
  background of a terminal: it cannot read from it. quorumlock ignores ^Z (SIGTSTP,
  SIGTTIN, SIGTTOU): stopped, it could neither keep the lock nor stop the command.
  Should quorumlock be stopped anyway (SIGSTOP to it or to its job's process group) or
  stall, the watchdog, in a process group of its own, kills the command's group by
  itself half the spare before the deadline (exit 70 once resumed). Both paused
  together (a cgroup freeze, a suspended machine) is beyond it.

EXIT STATUS
  0        try: got the lock; status: one token held on a majority; bench: done
  N        run: the command's own status; 128+N if it was killed by signal N
  1        status: no token held on a majority
  64       usage error: bad arguments, settings or node URLs (nothing was run)
  69       lock service unavailable: too few nodes answered for a majority
  70       run: the lock was lost (or ran too low) while the command ran; it was stopped
  71       operating-system error (fork, pipe, signals)
  75       not acquired within --wait: held by another client
  126      run: the command is not executable
  127      run: the command was not found
  128+N    run: quorumlock got signal N while waiting for the lock (nothing was run);
           bench: stopped by signal N

ENVIRONMENT
  QUORUMLOCK_NODES       comma-separated node URLs, used when --nodes is not given
  With the tls feature, for rediss:// nodes:
  QUORUMLOCK_TLS_CA_FILE PEM file of CA certificates, the only ones trusted when set;
                         else the system's bundle (SSL_CERT_FILE, else
                         /etc/ssl/certs/ca-certificates.crt, ...)
  QUORUMLOCK_TLS_CERT, QUORUMLOCK_TLS_KEY
                         client certificate and private key (PEM) for mutual TLS: both
                         or neither

EXAMPLE
  export QUORUMLOCK_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379
  quorumlock --ttl 1m --wait 10s run nightly-report -- ./make-report.sh --full
";

/// Parses `argv` (without the program name); `env_nodes` is `QUORUMLOCK_NODES`.
pub fn parse(argv: &[String], env_nodes: Option<&str>) -> Result<Parsed, String> {
    let mut positional: Vec<&str> = Vec::new();
    let mut command: Option<Vec<String>> = None;
    let mut nodes: Option<String> = None;
    let mut ttl = DEFAULT_TTL;
    let mut wait = Duration::ZERO;
    let mut kill_after = DEFAULT_KILL_AFTER;
    let mut timeout = DEFAULT_TIMEOUT;
    let mut retries = 0u32;
    let mut retry_delay = DEFAULT_RETRY_DELAY;
    let mut count: Option<u64> = None;
    let mut duration: Option<Duration> = None;
    let mut given = Vec::new();

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
            _ => (arg, None),
        };
        let known = [
            "--nodes",
            "--ttl",
            "--wait",
            "--kill-after",
            "--timeout",
            "--retries",
            "--retry-delay",
            "--count",
            "--duration",
        ];
        if !known.contains(&name) {
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
        given.push(name);
        match name {
            "--nodes" => nodes = Some(value),
            "--ttl" => ttl = nonzero(name, duration_arg(name, &value)?)?,
            "--wait" => wait = duration_arg(name, &value)?,
            "--kill-after" => kill_after = duration_arg(name, &value)?,
            "--timeout" => timeout = nonzero(name, duration_arg(name, &value)?)?,
            "--retry-delay" => retry_delay = nonzero(name, duration_arg(name, &value)?)?,
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
    only(
        &["--count", "--duration"],
        "bench",
        matches!(action, Action::Bench),
    )?;
    only(
        &["--wait", "--kill-after", "--retries"],
        "run",
        matches!(action, Action::Run { .. }),
    )?;
    if count.is_some() && duration.is_some() {
        return Err("give --count or --duration, not both".into());
    }

    let nodes: Vec<String> = nodes
        .as_deref()
        .or(env_nodes)
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    if nodes.is_empty() {
        return Err("no nodes: give --nodes URL,URL,... or set QUORUMLOCK_NODES".into());
    }
    Ok(Parsed::Go(Args {
        action,
        nodes,
        ttl,
        wait,
        kill_after,
        timeout,
        retries,
        retry_delay,
        count: count.unwrap_or(DEFAULT_COUNT),
        duration,
    }))
}

fn duration_arg(name: &str, value: &str) -> Result<Duration, String> {
    parse_duration(value).ok_or_else(|| {
        format!(
            "{name}: {value:?} is not a duration (a whole number with a unit: us, ms, s, m, h; \
             a bare number is milliseconds)"
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

/// `500ms`, `10s`, `2m`, `1h`, `250us`; a bare number is milliseconds. `None` for
/// anything else, or a value that overflows.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let n: u64 = s[..digits].parse().ok()?;
    let micros_per: u64 = match &s[digits..] {
        "" | "ms" => 1_000,
        "us" => 1,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        _ => return None,
    };
    n.checked_mul(micros_per).map(Duration::from_micros)
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
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250us"), Some(Duration::from_micros(250)));
        assert_eq!(parse_duration("1500"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        for bad in [
            "",
            "s",
            "10x",
            "-5",
            "1.5s",
            " 5",
            "5 s",
            "10S",
            "99999999999999999999",
            "18446744073709551615h",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn options_stand_anywhere_before_the_command() {
        let a = go("try x --ttl 5s");
        assert_eq!(a.ttl, Duration::from_secs(5));
        let a = go("--ttl=7s run x --wait 1s -- sh -c --ttl");
        assert_eq!(a.ttl, Duration::from_secs(7));
        assert_eq!(a.wait, Duration::from_secs(1));
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
        assert!(err("try x -- y").contains("only run"));
        assert!(err("frob x").contains("unknown action"));
        assert!(err("").contains("missing action"));
        assert!(err("try x --count 5").contains("only for bench"));
        assert!(err("bench --wait 5").contains("only for run"));
        assert!(err("bench --count 0").contains("positive"));
        assert!(err("--retries -1 run x -- y").contains("whole number"));
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
