//! Parsers for the values flags and variables take: durations, sizes, shares, addresses.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

/// A duration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {0:?} (use e.g. 10s, 250ms, 2m, 1h, or seconds)")]
    Invalid(String),
    #[error("invalid duration {0:?}: must be zero or positive")]
    Negative(String),
    #[error("invalid duration unit in {0:?} (use ms, s, m or h)")]
    Unit(String),
}

/// "10s", "250ms", "2m", "1h", or a plain number of seconds (fractions allowed). Not negative.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| DurationError::Invalid(s.to_owned()))?;
    if !n.is_finite() || n < 0.0 {
        return Err(DurationError::Negative(s.to_owned()));
    }
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(DurationError::Unit(s.to_owned())),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// A duration as flags write it: `0`, `250ms`, `30s`, `10m`, `1h` (the largest unit that
/// divides it; [`parse_duration`] reads it back).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0".to_owned(),
        _ if !ms.is_multiple_of(1000) => format!("{ms}ms"),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ => format!("{}s", ms / 1000),
    }
}

/// A duration flag: parsed by [`parse_duration`], shown by [`format_duration`], so a default
/// is written once, as a `Duration`, where the setting lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl FromStr for Dur {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s).map(Dur)
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

/// A duration that must be more than zero (a [`Dur`] flag).
pub fn parse_positive_duration(s: &str) -> Result<Dur, String> {
    match parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(Dur(d)),
        Ok(_) => Err("must be more than 0".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A rate of 0 or more per second.
pub fn parse_budget(s: &str) -> Result<f64, String> {
    let x: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if !x.is_finite() || x < 0.0 {
        return Err(format!("{x} is not a rate of 0 or more per second"));
    }
    Ok(x)
}

/// An HTTP path (with an optional query), starting with `/`.
pub fn parse_metrics_path(s: &str) -> Result<http::uri::PathAndQuery, String> {
    if !s.starts_with('/') {
        return Err(format!("{s:?} must start with /"));
    }
    s.parse()
        .map_err(|e: http::uri::InvalidUri| format!("{s:?}: {e}"))
}

/// A Kubernetes label selector: not empty, no empty requirement (`a=b,,c`), parentheses of
/// set-based requirements (`tier in (a,b)`) closed. The API server checks the rest.
pub fn parse_label_selector(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("an empty selector would count every pod of the namespace".into());
    }
    let mut depth = 0i32;
    let mut term = String::new();
    for c in s.chars().chain([',']) {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return Err(format!("{s:?}: unbalanced parentheses"));
        }
        if c == ',' && depth == 0 {
            if term.trim().is_empty() {
                return Err(format!("{s:?} has an empty requirement"));
            }
            term.clear();
        } else {
            term.push(c);
        }
    }
    if depth != 0 {
        return Err(format!("{s:?}: unbalanced parentheses"));
    }
    Ok(s.to_owned())
}

/// A byte size that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {0:?} (use e.g. 16MiB, 512KiB, 1GB, or bytes)")]
pub struct SizeError(String);

/// "16MiB", "512KiB", "1GB", "1048576": a size in bytes.
pub fn parse_bytes(s: &str) -> Result<usize, SizeError> {
    let t = s.trim();
    let bad = || SizeError(s.to_owned());
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim());
    let n: u64 = num.parse().map_err(|_| bad())?;
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "ki" => 1 << 10,
        "mib" | "mi" => 1 << 20,
        "gib" | "gi" => 1 << 30,
        "kb" | "k" => 1_000,
        "mb" | "m" => 1_000_000,
        "gb" | "g" => 1_000_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(scale)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(bad)
}

/// A size as flags write it: `16MiB`, `512KiB`, or bytes.
pub fn format_bytes(n: usize) -> String {
    match n {
        _ if n != 0 && n.is_multiple_of(1 << 20) => format!("{}MiB", n >> 20),
        _ if n != 0 && n.is_multiple_of(1 << 10) => format!("{}KiB", n >> 10),
        _ => n.to_string(),
    }
}

/// A listen address: `host:port`, `[v6]:port`, or a bare IPv6 address before the port
/// (`fd00::5:9090`, what `$(POD_IP):9090` expands to on an IPv6 pod), read as the last colon.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let bad = || format!("{s:?} is not an address:port (e.g. 0.0.0.0:8080 or [::]:8080)");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let ip: std::net::IpAddr = host.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok(SocketAddr::new(ip, port))
}

/// The request-head limit; the HTTP/1 reader needs room for at least 8 KiB.
pub fn parse_header_limit(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count"))?;
    if n < 8192 {
        return Err(format!(
            "{n} is below the smallest request-head limit, 8192"
        ));
    }
    Ok(n)
}

/// A share between 0 and 1.
pub fn parse_share(s: &str) -> Result<f64, String> {
    let x: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if !(0.0..=1.0).contains(&x) {
        return Err(format!("{x} is not a share between 0 and 1"));
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_refuse_empty_requirements_and_open_parentheses() {
        for ok in [
            "app.kubernetes.io/name=flexinfer-proxy",
            " app=a,release==r,tier!=x ",
            "env in (a,b),!legacy,tier",
        ] {
            assert_eq!(parse_label_selector(ok), Ok(ok.trim().to_owned()));
        }
        for bad in [
            "",
            "  ",
            "a=b,,c",
            "a=b,",
            ",a",
            "env in (a,b",
            "env in a,b)",
        ] {
            assert!(parse_label_selector(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn listen_addresses_take_bare_ipv6_before_the_port() {
        assert_eq!(
            parse_listen("0.0.0.0:80").unwrap().to_string(),
            "0.0.0.0:80"
        );
        assert_eq!(
            parse_listen("[::1]:9090").unwrap().to_string(),
            "[::1]:9090"
        );
        assert_eq!(
            parse_listen("fd00::5:9090").unwrap().to_string(),
            "[fd00::5]:9090"
        );
        assert!(parse_listen("localhost:80").is_err());
        assert!(parse_listen("10.0.0.1").is_err());
        assert!(parse_listen(":80").is_err());
    }

    #[test]
    fn limits_and_shares_reject_what_would_break_the_proxy() {
        assert!(parse_header_limit("8191").is_err());
        assert_eq!(parse_header_limit("65536"), Ok(65536));
        assert!(parse_share("1.5").is_err());
        assert!(parse_share("-0.1").is_err());
        assert_eq!(parse_share("0"), Ok(0.0));
    }

    #[test]
    fn durations_parse_and_format_back() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
        for (d, s) in [
            (Duration::ZERO, "0"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(600), "10m"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_millis(1500), "1500ms"),
        ] {
            assert_eq!(format_duration(d), s);
            assert_eq!(parse_duration(s), Ok(d), "{s} reads back");
        }
    }

    #[test]
    fn sizes_parse_and_format_back() {
        assert_eq!(parse_bytes("16MiB"), Ok(16 << 20));
        assert_eq!(parse_bytes("1 GB"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("-1").is_err() && parse_bytes("1.5MiB").is_err());
        for n in [16 << 20, 512 << 10, 1000, 0] {
            assert_eq!(parse_bytes(&format_bytes(n)), Ok(n));
        }
        assert_eq!(format_bytes(16 << 20), "16MiB");
    }
}
