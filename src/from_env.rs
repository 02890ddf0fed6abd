//! [`Builder::from_env`]: the settings of the environment the command-line tool reads,
//! for a library user configured the same way.
//!
//! # Invariants
//!
//! - A value that cannot be read is an [`Error::Config`] naming the variable; a node URL
//!   is shown with its password masked, never whole.
//! - A duration is a number of seconds when bare (`1.5`), or a number with a unit (`ms`,
//!   `s`, `m`, `h`, `us`): the command line's rule.

use crate::config::{Builder, Endpoint, mask};
use crate::error::{ConfigError, Error};
use std::time::Duration;

/// The variable of the node URLs.
const NODES: &str = "QUORUMLOCK_NODES";

impl Builder {
    /// A builder from the environment, read the way the `quorumlock` command line reads
    /// it, for services configured like it. Every variable but `QUORUMLOCK_NODES` is
    /// optional (unset or empty: the builder's default); methods called on the result
    /// override what it read.
    ///
    /// | Variable | Setting |
    /// |---|---|
    /// | `QUORUMLOCK_NODES` | the node URLs, separated by commas and/or white space ([`Builder::nodes`]) |
    /// | `QUORUMLOCK_NODE_TIMEOUT` | [`Builder::node_timeout`] |
    /// | `QUORUMLOCK_CONNECT_TIMEOUT` | [`Builder::connect_timeout`] |
    /// | `QUORUMLOCK_RETRIES` | [`Builder::retry_count`] (a whole number) |
    /// | `QUORUMLOCK_RETRY_DELAY` | [`Builder::retry_delay`] |
    /// | `QUORUMLOCK_RESTART_GUARD` | [`Builder::restart_guard`] |
    /// | `QUORUMLOCK_MAX_HOLD` | [`Builder::max_hold`] |
    /// | `QUORUMLOCK_FENCING` | [`Builder::fencing`]: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` |
    /// | `QUORUMLOCK_TLS_CA_FILE` | `Builder::tls_ca_file` (feature `tls`) |
    /// | `QUORUMLOCK_TLS_CERT`, `QUORUMLOCK_TLS_KEY` | `Builder::tls_client_cert`, both or neither (feature `tls`) |
    ///
    /// Durations are seconds when bare (`2`, `0.25`), or carry a unit: `ms`, `s`, `m`,
    /// `h`, `us` (`250ms`, `1.5s`).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the variable when `QUORUMLOCK_NODES` is unset or empty,
    /// a URL in it is invalid (shown with its password masked), a value cannot be read,
    /// or a TLS variable is set in a build without the `tls` feature. The ranges of the
    /// settings are checked by [`Builder::build`], as for any builder.
    ///
    /// # Example
    ///
    /// ```no_run
    /// // QUORUMLOCK_NODES="redis://10.0.0.1 redis://10.0.0.2 redis://10.0.0.3"
    /// // QUORUMLOCK_NODE_TIMEOUT=100ms QUORUMLOCK_FENCING=1
    /// let shared = quorumlock::Builder::from_env()?.build_shared()?;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn from_env() -> Result<Builder, Error> {
        Builder::from_lookup(|name| std::env::var_os(name))
    }

    /// [`Builder::from_env`] with `lookup` for the environment.
    pub(crate) fn from_lookup(
        lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Builder, Error> {
        let var = |name: &str| -> Result<Option<String>, Error> {
            match lookup(name) {
                None => Ok(None),
                Some(v) => match v.into_string() {
                    Ok(s) if s.trim().is_empty() => Ok(None),
                    Ok(s) => Ok(Some(s.trim().to_string())),
                    Err(_) => Err(bad(name, "(not UTF-8)", "not valid UTF-8")),
                },
            }
        };
        let Some(nodes) = var(NODES)? else {
            return Err(bad(
                NODES,
                "(unset)",
                "set it to the node URLs, separated by commas or spaces \
                 (redis://host1:6379,redis://host2:6379,...)",
            ));
        };
        let urls = split_node_list(&nodes);
        if urls.is_empty() {
            return Err(bad(NODES, mask(&nodes), "no node URL in it"));
        }
        for (i, url) in urls.iter().enumerate() {
            Endpoint::parse_as(&format!("{NODES}[{i}]"), url)?;
        }
        let mut b = Builder::default().nodes(urls);
        let duration = |name: &str| -> Result<Option<Duration>, Error> {
            var(name)?
                .map(|v| parse_duration(v.trim()).ok_or_else(|| bad(name, &v, DURATION)))
                .transpose()
        };
        if let Some(d) = duration("QUORUMLOCK_NODE_TIMEOUT")? {
            b = b.node_timeout(d);
        }
        if let Some(d) = duration("QUORUMLOCK_CONNECT_TIMEOUT")? {
            b = b.connect_timeout(d);
        }
        if let Some(d) = duration("QUORUMLOCK_RETRY_DELAY")? {
            b = b.retry_delay(d);
        }
        if let Some(d) = duration("QUORUMLOCK_RESTART_GUARD")? {
            b = b.restart_guard(d);
        }
        if let Some(d) = duration("QUORUMLOCK_MAX_HOLD")? {
            b = b.max_hold(d);
        }
        const RETRIES: &str = "QUORUMLOCK_RETRIES";
        if let Some(v) = var(RETRIES)? {
            let n = v
                .parse::<u32>()
                .map_err(|_| bad(RETRIES, &v, "not a whole number of retries"))?;
            b = b.retry_count(n);
        }
        const FENCING: &str = "QUORUMLOCK_FENCING";
        if let Some(v) = var(FENCING)? {
            let on = match v.to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => return Err(bad(FENCING, &v, "expected 1/true/yes/on or 0/false/no/off")),
            };
            b = b.fencing(on);
        }
        let ca = var("QUORUMLOCK_TLS_CA_FILE")?;
        let cert = var("QUORUMLOCK_TLS_CERT")?;
        let key = var("QUORUMLOCK_TLS_KEY")?;
        tls(b, ca, cert, key)
    }
}

const DURATION: &str = "not a duration: seconds (2, 0.5) or a number with a unit (250ms, 1.5s, \
                        2m, 1h, 500us)";

fn bad(name: &str, value: impl Into<String>, problem: &str) -> Error {
    Error::Config(ConfigError::new(name, value, problem))
}

#[cfg(feature = "tls")]
fn tls(
    mut b: Builder,
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
) -> Result<Builder, Error> {
    if let Some(ca) = ca {
        b = b.tls_ca_file(ca);
    }
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(b.tls_client_cert(cert, key)),
        (None, None) => Ok(b),
        (Some(_), None) => Err(bad(
            "QUORUMLOCK_TLS_KEY",
            "(unset)",
            "QUORUMLOCK_TLS_CERT is set: its key goes with it",
        )),
        (None, Some(_)) => Err(bad(
            "QUORUMLOCK_TLS_CERT",
            "(unset)",
            "QUORUMLOCK_TLS_KEY is set: its certificate goes with it",
        )),
    }
}

#[cfg(not(feature = "tls"))]
fn tls(
    b: Builder,
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
) -> Result<Builder, Error> {
    let set = [
        ("QUORUMLOCK_TLS_CA_FILE", ca),
        ("QUORUMLOCK_TLS_CERT", cert),
        ("QUORUMLOCK_TLS_KEY", key),
    ];
    match set.into_iter().find(|(_, v)| v.is_some()) {
        Some((name, Some(v))) => Err(bad(
            name,
            v,
            "TLS is not available: quorumlock was built without the `tls` feature",
        )),
        _ => Ok(b),
    }
}

/// A duration as the command line and the environment read one (one rule for both):
/// `5` and `2.5` (seconds), `500ms`, `1.5s`, `2m`, `1h`, `250us`. `None` for anything
/// else (a sign, blanks, an exponent, `.5`, `5.`), or a value that overflows. Exact
/// (integer arithmetic, no float); digits past the nanosecond are dropped.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let digits = |t: &str| t.bytes().take_while(u8::is_ascii_digit).count();
    let whole_len = digits(s);
    if whole_len == 0 {
        return None;
    }
    let (whole, rest) = s.split_at(whole_len);
    let (frac, unit) = match rest.strip_prefix('.') {
        Some(after) => {
            let n = digits(after);
            if n == 0 {
                return None;
            }
            after.split_at(n)
        }
        None => ("", rest),
    };
    let nanos_per: u128 = match unit {
        "" | "s" => 1_000_000_000,
        "ms" => 1_000_000,
        "us" => 1_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    };
    // 39 digits would overflow u128; anything past u64 seconds is refused below anyway.
    if whole.len() > 30 {
        return None;
    }
    let mut nanos = whole.parse::<u128>().ok()?.checked_mul(nanos_per)?;
    // At most 20 fraction digits count (10^20 × 3.6e12 fits a u128): beyond them lies
    // less than a nanosecond even in hours.
    let frac = &frac[..frac.len().min(20)];
    if !frac.is_empty() {
        let scale = 10u128.pow(frac.len() as u32);
        nanos = nanos.checked_add(frac.parse::<u128>().ok()? * nanos_per / scale)?;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// The URLs of a node list (`QUORUMLOCK_NODES`, the tool's `--nodes`): separated by
/// commas or white space. A password may hold a comma (URLs allow one in the user
/// part): a piece with no scheme (`://`) belongs to the URL before it, so a password is
/// never cut in two, and never half-printed by a message about the piece.
pub fn split_node_list(list: &str) -> Vec<String> {
    let mut urls: Vec<String> = Vec::new();
    for piece in list.split(',') {
        for (i, word) in piece.split_whitespace().enumerate() {
            match urls.last_mut() {
                Some(last) if !word.contains("://") => {
                    // The comma (or, within a piece, the space) it was split at.
                    last.push(if i == 0 { ',' } else { ' ' });
                    last.push_str(word);
                }
                _ => urls.push(word.to_string()),
            }
        }
    }
    urls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_with_a_comma_stays_in_its_url() {
        let list = "redis://u:pa,ss@h1:6379, redis://h2 ,,unix:///run/r.sock\tredis://:x,y,z@h3";
        assert_eq!(
            split_node_list(list),
            [
                "redis://u:pa,ss@h1:6379",
                "redis://h2",
                "unix:///run/r.sock",
                "redis://:x,y,z@h3"
            ]
        );
        assert!(split_node_list(" , ").is_empty());
    }
    use std::collections::HashMap;
    use std::ffi::OsString;

    fn from(vars: &[(&str, &str)]) -> Result<Builder, Error> {
        let env: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Builder::from_lookup(|name| env.get(name).cloned())
    }

    fn config_error(vars: &[(&str, &str)]) -> ConfigError {
        match from(vars) {
            Err(Error::Config(c)) => c,
            other => panic!("not a configuration error: {other:?}"),
        }
    }

    #[test]
    fn durations_are_seconds_when_bare_and_take_units() {
        let d = |s| parse_duration(s);
        assert_eq!(d("2"), Some(Duration::from_secs(2)));
        assert_eq!(d("0.25"), Some(Duration::from_millis(250)));
        assert_eq!(d("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(d("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(d("2m"), Some(Duration::from_secs(120)));
        assert_eq!(d("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(d("500us"), Some(Duration::from_micros(500)));
        for bad in ["", "s", "-1", "1x", "1..2", ".", "ms5", "1e3"] {
            assert_eq!(d(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn every_setting_is_read() {
        let b = from(&[
            (
                NODES,
                " redis://127.0.0.1:7001, redis://127.0.0.1:7002\tredis://h3:7003 ",
            ),
            ("QUORUMLOCK_NODE_TIMEOUT", "0.1"),
            ("QUORUMLOCK_CONNECT_TIMEOUT", "2s"),
            ("QUORUMLOCK_RETRIES", "7"),
            ("QUORUMLOCK_RETRY_DELAY", "20ms"),
            ("QUORUMLOCK_RESTART_GUARD", "1m"),
            ("QUORUMLOCK_MAX_HOLD", "1h"),
            ("QUORUMLOCK_FENCING", "yes"),
        ])
        .unwrap();
        let s = b.settings().unwrap();
        assert_eq!(s.nodes.len(), 3);
        assert_eq!(s.nodes[2].to_string(), "redis://h3:7003");
        assert_eq!(s.node_timeout, Duration::from_millis(100));
        assert_eq!(s.connect_timeout, Duration::from_secs(2));
        assert_eq!(s.retry_count, 7);
        assert_eq!(s.retry_delay, Duration::from_millis(20));
        assert_eq!(s.restart_guard, Duration::from_secs(60));
        assert_eq!(s.max_hold, Some(Duration::from_secs(3600)));
        assert!(s.fencing);
        // Unset and empty variables leave the defaults.
        let s = from(&[
            (NODES, "redis://127.0.0.1:7001"),
            ("QUORUMLOCK_RETRIES", ""),
        ])
        .unwrap()
        .settings()
        .unwrap();
        let d = Builder::default()
            .node("redis://127.0.0.1:7001")
            .settings()
            .unwrap();
        assert_eq!(s.retry_count, d.retry_count);
        assert_eq!(s.node_timeout, d.node_timeout);
        assert!(!s.fencing);
    }

    #[test]
    fn errors_name_the_variable_and_never_show_a_password() {
        let e = config_error(&[]);
        assert_eq!(e.setting, NODES);
        let e = config_error(&[(NODES, " , ")]);
        assert_eq!(e.setting, NODES);
        let e = config_error(&[(NODES, "redis://u:hunter2@127.0.0.1:7001,http://x:hunter2@y")]);
        assert_eq!(e.setting, "QUORUMLOCK_NODES[1]");
        let shown = Error::Config(e).to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
        for (name, value) in [
            ("QUORUMLOCK_NODE_TIMEOUT", "soon"),
            ("QUORUMLOCK_CONNECT_TIMEOUT", "-1"),
            ("QUORUMLOCK_RETRY_DELAY", "1 fortnight"),
            ("QUORUMLOCK_RESTART_GUARD", "x"),
            ("QUORUMLOCK_MAX_HOLD", "1d"),
            ("QUORUMLOCK_RETRIES", "-3"),
            ("QUORUMLOCK_FENCING", "maybe"),
        ] {
            let e = config_error(&[(NODES, "redis://u:hunter2@127.0.0.1:7001"), (name, value)]);
            assert_eq!(e.setting, name);
            let shown = Error::Config(e).to_string();
            assert!(
                shown.contains(name) && !shown.contains("hunter2"),
                "{shown}"
            );
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_variables_need_the_feature() {
        let e = config_error(&[
            (NODES, "redis://127.0.0.1:7001"),
            ("QUORUMLOCK_TLS_CA_FILE", "/etc/ca.pem"),
        ]);
        assert_eq!(e.setting, "QUORUMLOCK_TLS_CA_FILE");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_client_certificate_and_key_go_together() {
        let e = config_error(&[
            (NODES, "rediss://127.0.0.1:7001"),
            ("QUORUMLOCK_TLS_CERT", "/c.pem"),
        ]);
        assert_eq!(e.setting, "QUORUMLOCK_TLS_KEY");
        let e = from(&[
            (NODES, "rediss://127.0.0.1:7001"),
            ("QUORUMLOCK_TLS_CA_FILE", "/no/such/ca.pem"),
        ])
        .unwrap()
        .settings()
        .unwrap_err();
        assert_eq!(
            e.setting, "tls_ca_file",
            "the file is read when the settings are checked"
        );
    }
}
