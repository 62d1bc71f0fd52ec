//! Which answers of a pod are retried on the next candidate (`--retry-on-status`), before any
//! byte reached the client and within the retry budget.
//!
//! The default is 500, 502, 503 and 504: a pod that fails everything (a broken engine, an
//! out-of-memory loop) answers 500, and until its ejection every client it gets would see
//! that 500. A 500 that every pod returns for the same body (a request the engine cannot
//! serve) is retried too, but the retry budget bounds the extra load to its share of the
//! requests (20 % by default), and each request tries at most `--max-pod-attempts` pods.
//! 429 is allowed in the list (a pod's own admission said no) but not in the default: an engine
//! that answers 429 usually means the whole fleet is full, which the proxy's queue handles.

use std::fmt;
use std::str::FromStr;

/// A set of HTTP statuses, each 429 or 500 to 599.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RetryOn {
    /// Bit `s - 500` for 5xx statuses.
    server_errors: u128,
    too_many_requests: bool,
}

impl RetryOn {
    pub const DEFAULT: RetryOn = RetryOn {
        server_errors: 1 | 1 << 2 | 1 << 3 | 1 << 4,
        too_many_requests: false,
    };

    /// Nothing is retried on its status (resets still are).
    pub const NONE: RetryOn = RetryOn {
        server_errors: 0,
        too_many_requests: false,
    };

    pub fn contains(&self, status: u16) -> bool {
        match status {
            429 => self.too_many_requests,
            500..=599 => self.server_errors & (1 << (status - 500)) != 0,
            _ => false,
        }
    }

    fn statuses(&self) -> impl Iterator<Item = u16> + '_ {
        let low = self.too_many_requests.then_some(429);
        low.into_iter()
            .chain((500..=599).filter(|s| self.contains(*s)))
    }
}

impl Default for RetryOn {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl FromStr for RetryOn {
    type Err = String;

    /// A comma-separated list of statuses (`500,502,503,504`), or `none`.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("none") || s.eq_ignore_ascii_case("off") {
            return Ok(Self::NONE);
        }
        let mut set = Self::NONE;
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.parse::<u16>() {
                Ok(429) => set.too_many_requests = true,
                Ok(n @ 500..=599) => set.server_errors |= 1 << (n - 500),
                _ => {
                    return Err(format!(
                        "{part:?} is not a retryable status (429 or 500 to 599; \"none\" for no status)"
                    ))
                }
            }
        }
        if set == Self::NONE {
            return Err("an empty list; say \"none\" to retry on no status".into());
        }
        Ok(set)
    }
}

impl fmt::Display for RetryOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.statuses().map(|s| s.to_string()).collect();
        match list.is_empty() {
            true => f.write_str("none"),
            false => f.write_str(&list.join(",")),
        }
    }
}

impl fmt::Debug for RetryOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_gateway_errors_and_500() {
        let d = RetryOn::default();
        for s in [500, 502, 503, 504] {
            assert!(d.contains(s), "{s}");
        }
        for s in [200, 400, 404, 429, 501, 505] {
            assert!(!d.contains(s), "{s}");
        }
        assert_eq!(d.to_string(), "500,502,503,504");
    }

    #[test]
    fn lists_parse_and_print_back() {
        let r: RetryOn = " 503, 429 ,507".parse().unwrap();
        assert!(r.contains(429) && r.contains(503) && r.contains(507));
        assert!(!r.contains(500));
        assert_eq!(r.to_string(), "429,503,507");
        assert_eq!("none".parse::<RetryOn>().unwrap(), RetryOn::NONE);
        assert_eq!(RetryOn::NONE.to_string(), "none");
    }

    #[test]
    fn statuses_that_are_no_failure_are_refused() {
        for bad in ["200", "404", "600", "5xx", "", " , "] {
            assert!(bad.parse::<RetryOn>().is_err(), "{bad:?}");
        }
    }
}
