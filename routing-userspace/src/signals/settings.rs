//! The knobs of engine signals (`serve` flags with their environment variables), validated
//! once into [`SignalSettings`]. Values that cannot work are refused by the flag parser, with
//! the reason, rather than replaced.

use std::time::Duration;

use clap::{ArgAction, Args};

use super::scrape::ScrapeConfig;
use super::store::DEFAULT_STALENESS;
use crate::config::parse_duration;

/// Engine-signal options of `flexinfer-proxy serve`.
#[derive(Debug, Clone, Args)]
pub struct SignalArgs {
    /// Ask engines for a load report on each forwarded request
    /// (`endpoint-load-metrics-format: text`) and read the one they answer with.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_LOAD_REPORTS",
        default_value_t = true,
        action = ArgAction::Set
    )]
    pub engine_load_reports: bool,

    /// How long an engine load report counts in its pod's load.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_REPORT_STALENESS",
        default_value = "2s",
        value_parser = parse_positive_duration
    )]
    pub engine_report_staleness: Duration,

    /// Reads of each pod's metrics page per second, by the whole fleet (0 = never scrape).
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_SCRAPE_BUDGET",
        default_value = "1",
        value_parser = parse_budget
    )]
    pub engine_scrape_budget: f64,

    /// The longest a scraped report counts, however rarely a large fleet lets one proxy read.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_SCRAPE_MAX_AGE",
        default_value = "5s",
        value_parser = parse_positive_duration
    )]
    pub engine_scrape_max_age: Duration,

    /// Time cap of one page read, connect to last byte.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_SCRAPE_TIMEOUT",
        default_value = "2s",
        value_parser = parse_positive_duration
    )]
    pub engine_scrape_timeout: Duration,

    /// The engines' metrics path.
    #[arg(
        long,
        env = "FLEXINFER_PROXY_ENGINE_METRICS_PATH",
        default_value = "/metrics",
        value_parser = parse_metrics_path
    )]
    pub engine_metrics_path: http::uri::PathAndQuery,

    /// Proxies in the fleet, when discovery cannot count them (0 = as discovery counts, at
    /// least 1). Scrapes per proxy are spread by it.
    #[arg(long, env = "FLEXINFER_PROXY_FLEET_SIZE", default_value_t = 0)]
    pub fleet_size: usize,
}

/// Validated engine-signal settings.
#[derive(Debug, Clone)]
pub struct SignalSettings {
    /// Send the ORCA request header and read the response header.
    pub inband: bool,
    /// How long an in-band report counts.
    pub staleness: Duration,
    /// `None`: no scraping.
    pub scrape: Option<ScrapeConfig>,
    /// A fixed fleet size (0: from discovery).
    pub fleet_size: usize,
}

impl Default for SignalSettings {
    fn default() -> Self {
        Self {
            inband: true,
            staleness: DEFAULT_STALENESS,
            scrape: Some(ScrapeConfig::default()),
            fleet_size: 0,
        }
    }
}

impl SignalArgs {
    pub fn settings(&self) -> SignalSettings {
        let scrape = (self.engine_scrape_budget > 0.0).then(|| ScrapeConfig {
            path: self.engine_metrics_path.clone(),
            budget: self.engine_scrape_budget,
            max_report_age: self.engine_scrape_max_age,
            timeout: self.engine_scrape_timeout,
            ..ScrapeConfig::default()
        });
        SignalSettings {
            inband: self.engine_load_reports,
            staleness: self.engine_report_staleness,
            scrape,
            fleet_size: self.fleet_size,
        }
    }
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("must be more than 0".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_budget(s: &str) -> Result<f64, String> {
    let x: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if !x.is_finite() || x < 0.0 {
        return Err(format!("{x} is not a rate of 0 or more per second"));
    }
    Ok(x)
}

fn parse_metrics_path(s: &str) -> Result<http::uri::PathAndQuery, String> {
    if !s.starts_with('/') {
        return Err(format!("{s:?} must start with /"));
    }
    s.parse()
        .map_err(|e: http::uri::InvalidUri| format!("{s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        signals: SignalArgs,
    }

    /// Parse flags, with environment variables given as a map (never the process's): each
    /// becomes its flag, which is how clap would read it.
    fn parse(args: &[&str], env: &[(&str, &str)]) -> Result<SignalSettings, clap::Error> {
        let env: HashMap<&str, &str> = env.iter().copied().collect();
        let cmd = <Cli as clap::CommandFactory>::command();
        let mut argv = vec!["proxy".to_owned()];
        for a in cmd.get_arguments() {
            let var = a.get_env().and_then(|v| v.to_str());
            if let (Some(v), Some(long)) = (var.and_then(|v| env.get(v)), a.get_long()) {
                argv.push(format!("--{long}={v}"));
            }
        }
        argv.extend(args.iter().map(|s| (*s).to_owned()));
        let cli = Cli::try_parse_from(argv)?;
        Ok(cli.signals.settings())
    }

    #[test]
    fn defaults() {
        let s = parse(&[], &[]).unwrap();
        assert!(s.inband);
        assert_eq!(s.staleness, Duration::from_secs(2));
        let scrape = s.scrape.unwrap();
        assert_eq!(scrape.budget, 1.0);
        assert_eq!(scrape.path, "/metrics");
        assert_eq!(scrape.max_report_age, Duration::from_secs(5));
        assert_eq!(s.fleet_size, 0);
    }

    #[test]
    fn flags_and_environment() {
        let s = parse(
            &[
                "--engine-load-reports",
                "false",
                "--engine-metrics-path",
                "/v1/metrics",
            ],
            &[
                ("FLEXINFER_PROXY_ENGINE_SCRAPE_BUDGET", "0.5"),
                ("FLEXINFER_PROXY_ENGINE_REPORT_STALENESS", "1500ms"),
                ("FLEXINFER_PROXY_FLEET_SIZE", "10"),
            ],
        )
        .unwrap();
        assert!(!s.inband);
        assert_eq!(s.staleness, Duration::from_millis(1500));
        assert_eq!(s.fleet_size, 10);
        let scrape = s.scrape.unwrap();
        assert_eq!((scrape.budget, scrape.path.as_str()), (0.5, "/v1/metrics"));
        let off = parse(&[], &[("FLEXINFER_PROXY_ENGINE_SCRAPE_BUDGET", "0")]).unwrap();
        assert!(off.scrape.is_none());
    }

    #[test]
    fn bad_values_are_refused_with_the_reason() {
        for (args, why) in [
            (&["--engine-scrape-budget=-1"][..], "0 or more"),
            (&["--engine-scrape-budget", "NaN"][..], "0 or more"),
            (&["--engine-scrape-budget", "lots"][..], "not a number"),
            (&["--engine-report-staleness", "0s"][..], "more than 0"),
            (
                &["--engine-metrics-path", "metrics"][..],
                "must start with /",
            ),
            (&["--engine-load-reports", "maybe"][..], "maybe"),
        ] {
            let e = parse(args, &[]).unwrap_err().to_string();
            assert!(e.contains(why), "{args:?}: {e}");
        }
    }
}
