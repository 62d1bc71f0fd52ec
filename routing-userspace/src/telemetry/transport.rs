//! How spans reach the collector: plain HTTP/1.1 for an `http://` endpoint, TLS for an
//! `https://` one (a collector behind an ingress, or a vendor's intake).
//!
//! TLS trusts the platform's roots plus the CA file that `OTEL_EXPORTER_OTLP_CERTIFICATE` (or
//! its traces twin) names: the usual case in a cluster is a collector with a certificate from
//! the cluster's own CA. A CA file that cannot be read, or holds no certificate, stops `serve`
//! with the path and the reason; silently exporting nowhere would be worse. Headers
//! (`OTEL_EXPORTER_OTLP_HEADERS`, e.g. an API key) go on each request
//! ([`super::otlp::headers_from_env`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry_http::hyper::HyperClient;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use super::TraceError;

/// The exporter's HTTP client: http and https, with `timeout` per export request.
pub fn client(
    ca_file: Option<&Path>,
    timeout: Duration,
) -> Result<HyperClient<HttpsConnector<HttpConnector>>, TraceError> {
    let roots = roots(ca_file)?;
    let tls =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| TraceError::Exporter(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(HyperClient::new(connector, timeout, None))
}

/// Stop early on a CA file that cannot serve (before anything touches the node).
pub fn check_ca_file(path: &Path) -> Result<(), TraceError> {
    roots(Some(path)).map(drop)
}

/// The platform's roots (those it has; a bare image may have none) and the CA file's.
fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, TraceError> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        let bad = |why: String| TraceError::Certificate {
            path: path.display().to_string(),
            why,
        };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| bad(pem_error(e)))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(pem_error(e)))?;
        if certs.is_empty() {
            return Err(bad("no PEM certificate in it".to_owned()));
        }
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(bad("none of its certificates parses".to_owned()));
        }
    }
    Ok(roots)
}

/// A PEM reading error in words (the library's own names section markers by their bytes).
fn pem_error(e: rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error;
    match e {
        Error::Io(e) => e.to_string(),
        Error::MissingSectionEnd { .. } => "a PEM section has no END line".to_owned(),
        Error::IllegalSectionStart { .. } => "a PEM section's BEGIN line is malformed".to_owned(),
        Error::Base64Decode(why) => format!("a PEM section is not valid base64 ({why})"),
        other => format!("not valid PEM ({other})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_ca_file_is_an_error_that_names_it() {
        let e = roots(Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn a_ca_file_without_certificates_is_an_error() {
        let dir = std::env::temp_dir().join(format!("fx-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("empty.pem");
        std::fs::write(&f, "not a certificate\n").unwrap();
        let e = roots(Some(&f)).unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        std::fs::write(&f, "-----BEGIN CERTIFICATE-----\nAAAA\n").unwrap();
        let e = roots(Some(&f)).unwrap_err();
        assert!(e.to_string().contains("has no END line"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
