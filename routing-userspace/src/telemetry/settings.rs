//! What tracing runs with: where spans go, which requests are sampled, the bounds of the
//! export queue and how export bodies are compressed. Off (no exporter, nothing per request)
//! unless an OTLP endpoint is given.

use std::path::PathBuf;
use std::time::Duration;

use super::sampler::Sampler;

/// The signal path appended to `OTEL_EXPORTER_OTLP_ENDPOINT` (a traces endpoint is used as is).
pub const TRACES_PATH: &str = "/v1/traces";

/// `service.name` of the spans (`OTEL_SERVICE_NAME`).
pub const DEFAULT_SERVICE_NAME: &str = "flexinfer-proxy";

#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// The full OTLP/HTTP traces URL (`None`: tracing off).
    pub endpoint: Option<String>,
    pub service_name: String,
    pub sampler: Sampler,
    /// Ended spans waiting for export; past it, spans are dropped (and counted).
    pub queue_size: usize,
    /// Spans per export request.
    pub batch_size: usize,
    /// Longest a span waits for its batch to fill.
    pub batch_delay: Duration,
    /// One export request, connect to answer; past it the batch counts as dropped.
    pub export_timeout: Duration,
    /// A PEM file of CAs trusted for an https collector, beside the platform's roots.
    pub ca_certificate: Option<PathBuf>,
    /// How export request bodies are compressed (`OTEL_EXPORTER_OTLP_COMPRESSION`).
    pub compression: Compression,
}

/// The export body's compression: the values of `OTEL_EXPORTER_OTLP_COMPRESSION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Gzip,
}

impl Compression {
    /// `gzip` or `none` (an empty value is unset: none).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "" | "none" => Ok(Self::None),
            "gzip" => Ok(Self::Gzip),
            other => Err(format!("{other:?} is not gzip or none")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
        }
    }
}

impl TraceSettings {
    /// The batch span processor's defaults (`OTEL_BSP_*`), but a 10 s export timeout instead
    /// of 30 s: a hung collector then holds one batch for less time.
    pub const DEFAULT: Self = Self {
        endpoint: None,
        service_name: String::new(),
        sampler: Sampler::DEFAULT,
        queue_size: 2048,
        batch_size: 512,
        batch_delay: Duration::from_secs(5),
        export_timeout: Duration::from_secs(10),
        ca_certificate: None,
        compression: Compression::None,
    };

    pub fn enabled(&self) -> bool {
        self.endpoint.is_some()
    }
}

impl Default for TraceSettings {
    fn default() -> Self {
        Self {
            service_name: DEFAULT_SERVICE_NAME.to_owned(),
            ..Self::DEFAULT
        }
    }
}

/// The traces URL from the two standard variables: the traces endpoint as it is, else the
/// general endpoint with `/v1/traces` appended. Empty values count as unset.
pub fn traces_endpoint(general: Option<&str>, traces: Option<&str>) -> Option<String> {
    fn set(v: Option<&str>) -> Option<&str> {
        v.map(str::trim).filter(|v| !v.is_empty())
    }
    if let Some(t) = set(traces) {
        return Some(t.to_owned());
    }
    let base = set(general)?;
    Some(format!("{}{TRACES_PATH}", base.trim_end_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_is_gzip_or_none() {
        assert_eq!(Compression::parse("gzip"), Ok(Compression::Gzip));
        assert_eq!(Compression::parse(" none "), Ok(Compression::None));
        assert_eq!(Compression::parse(""), Ok(Compression::None));
        for bad in ["GZIP", "zstd", "deflate"] {
            assert!(Compression::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_traces_endpoint_wins_and_the_general_one_gets_the_path() {
        let e = traces_endpoint;
        assert_eq!(e(None, None), None);
        assert_eq!(e(Some(" "), Some("")), None);
        assert_eq!(
            e(Some("http://c:4318"), None).as_deref(),
            Some("http://c:4318/v1/traces")
        );
        assert_eq!(
            e(Some("http://c:4318/"), None).as_deref(),
            Some("http://c:4318/v1/traces")
        );
        assert_eq!(
            e(Some("http://c:4318"), Some("http://t:1/x")).as_deref(),
            Some("http://t:1/x")
        );
    }
}
