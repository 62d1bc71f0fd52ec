//! Command-line flags of the two stream bins (`--name value` and bare `--switch`), kept tiny:
//! this crate stays free of an argument-parsing dependency.

use std::str::FromStr;

/// Parsed `--name value` pairs in order; a flag followed by another flag (or nothing) has no
/// value.
pub struct Flags(Vec<(String, Option<String>)>);

impl Flags {
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let mut out: Vec<(String, Option<String>)> = Vec::new();
        for a in args {
            if let Some(name) = a.strip_prefix("--") {
                out.push((name.to_owned(), None));
            } else if let Some((_, v @ None)) = out.last_mut() {
                *v = Some(a);
            } else {
                return Err(format!("unexpected argument {a:?}"));
            }
        }
        Ok(Self(out))
    }

    /// Fail on a flag not in `known`.
    pub fn only(&self, known: &[&str]) -> Result<(), String> {
        match self.0.iter().find(|(n, _)| !known.contains(&n.as_str())) {
            Some((n, _)) => Err(format!(
                "unknown flag --{n} (known: --{})",
                known.join(", --")
            )),
            None => Ok(()),
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(n, _)| n == name)
    }

    /// Every value of a repeatable flag, parsed.
    pub fn all<T: FromStr>(&self, name: &str) -> Result<Vec<T>, String> {
        self.0
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| {
                let v = v
                    .as_deref()
                    .ok_or_else(|| format!("--{name} needs a value"))?;
                v.parse().map_err(|_| format!("--{name} {v:?}: not valid"))
            })
            .collect()
    }

    /// The last value of `name`, parsed, or `default`.
    pub fn get<T: FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        Ok(self.all(name)?.pop().unwrap_or(default))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(s: &str) -> Result<Flags, String> {
        Flags::parse(s.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn values_switches_and_errors() {
        let f = flags("--listen a:1 --listen b:2 --events 5 --bulk").unwrap();
        assert_eq!(f.all::<String>("listen").unwrap(), ["a:1", "b:2"]);
        assert_eq!(f.get("events", 1u32).unwrap(), 5);
        assert_eq!(f.get("interval-ms", 20u64).unwrap(), 20);
        assert!(f.has("bulk") && !f.has("idle"));
        assert!(f.only(&["listen", "events", "bulk"]).is_ok());
        assert!(f.only(&["listen"]).unwrap_err().contains("--events"));
        assert!(f.get::<u32>("listen", 0).is_err());
        assert!(flags("stray").is_err());
        assert!(flags("--events").unwrap().get::<u32>("events", 0).is_err());
    }
}
