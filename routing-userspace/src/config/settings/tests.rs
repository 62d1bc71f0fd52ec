use std::time::Duration;

use clap::{Args, FromArgMatches};

use super::*;
use crate::vocab::LabelGroupMode;

/// `serve`'s flags as the command line gives them, with no environment variable read (a test
/// must not depend on the environment it runs in).
fn serve_args(flags: &[&str]) -> ServeArgs {
    let cmd = ServeArgs::augment_args(clap::Command::new("serve")).mut_args(|a| a.env(None));
    let matches = cmd
        .try_get_matches_from(std::iter::once("serve").chain(flags.iter().copied()))
        .expect("valid flags");
    ServeArgs::from_arg_matches(&matches).expect("flags into ServeArgs")
}

fn routing(flags: &[&str]) -> (RoutingKnobs, Vec<&'static str>) {
    let (k, w) = Settings::from_args(&serve_args(flags));
    (k.routing, w.iter().map(|w| w.knob).collect())
}

#[test]
fn no_flags_are_the_defaults_each_setting_declares() {
    let (s, warnings) = Settings::from_args(&serve_args(&[]));
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(s.routing, RoutingKnobs::DEFAULT);
    assert_eq!(
        format!("{:?}", s.limits),
        format!("{:?}", RequestLimits::DEFAULT)
    );
    assert_eq!(
        format!("{:?}", s.upstream),
        format!("{:?}", UpstreamOptions::DEFAULT)
    );
    assert_eq!(
        format!("{:?}", s.server),
        format!("{:?}", ServeOptions::PROXY)
    );
    assert_eq!(s.ejection, EjectionPolicy::DEFAULT);
    assert_eq!(s.key_tracking, KeyTracking::DEFAULT);
    assert_eq!(s.shutdown_delay, DEFAULT_SHUTDOWN_DELAY);
    assert_eq!(
        s.retry,
        RetrySettings {
            share: crate::proxy::retry_budget::RetryBudget::DEFAULT_SHARE,
            min_per_second: crate::proxy::retry_budget::RetryBudget::DEFAULT_MIN_PER_SECOND,
            on_status: crate::proxy::retry_on::RetryOn::DEFAULT,
        }
    );
    assert!(matches!(
        s.discovery,
        DiscoverySettings::File { path: None, poll } if poll == crate::discovery::file::DEFAULT_POLL
    ));
    assert_eq!(s.admission, crate::admission::AdmissionDefaults::default());
}

#[test]
fn a_sheddable_request_never_outwaits_the_queue() {
    let (s, _) = Settings::from_args(&serve_args(&["--queue-sheddable-timeout=60s"]));
    assert_eq!(s.admission.sheddable_timeout, Duration::from_secs(30));
}

#[test]
fn valid_knobs_are_taken() {
    let (k, w) = routing(&[
        "--explicit-key-max-length=64",
        "--system-segment-max-length=1024",
        "--document-segment-max-length=32",
        "--least-loaded-reservation-ttl=250ms",
        "--label-group-routing=least-loaded",
        "--max-pod-attempts=5",
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        k.limits,
        KeyLimits {
            explicit_key_max_length: 64,
            system_segment_max_length: 1024,
            document_segment_max_length: 32
        }
    );
    assert_eq!(k.reservation_ttl, Duration::from_millis(250));
    assert_eq!(k.label_group_mode, LabelGroupMode::LeastLoaded);
    assert_eq!(k.max_pod_attempts, 5, "set where it is validated, once");
}

#[test]
fn invalid_or_non_positive_knobs_fall_back_to_defaults() {
    let (k, w) = routing(&[
        "--explicit-key-max-length=0",
        "--system-segment-max-length=-5",
        "--document-segment-max-length=abc",
        "--least-loaded-reservation-ttl=-1s",
        "--label-group-routing=random",
    ]);
    assert_eq!(k, RoutingKnobs::DEFAULT);
    assert_eq!(
        w,
        [
            "PROXY_ROUTING_EXPLICIT_KEY_MAX_LENGTH",
            "PROXY_ROUTING_SYSTEM_SEGMENT_MAX_LENGTH",
            "PROXY_ROUTING_DOCUMENT_SEGMENT_MAX_LENGTH",
            "PROXY_LEAST_LOADED_RESERVATION_TTL",
            "FLEXINFER_PROXY_LABEL_GROUP_ROUTING"
        ]
    );
}

#[test]
fn ttl_zero_disables_reservations() {
    let (k, w) = routing(&["--least-loaded-reservation-ttl=0"]);
    assert!(w.is_empty());
    assert_eq!(k.reservation_ttl, Duration::ZERO);
}

#[test]
fn hash_balance_and_index_knobs_validate_like_the_others() {
    let (k, w) = routing(&[
        "--hash-balance-factor=1.5",
        "--hash-balance-floor=0",
        "--cache-aware-balance-factor=2",
        "--session-balance-factor=1.1",
        "--cache-aware-index-budget=512KiB",
        "--route-header",
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        (k.hash_balance.factor_milli, k.hash_balance.floor),
        (1500, 0)
    );
    assert_eq!(k.cache_aware_factor_milli, 2000);
    assert_eq!(k.session_factor_milli, 1100);
    assert_eq!(k.cache_aware_index_budget, 512 << 10);
    assert!(k.route_header);
    assert!(
        !routing(&["--hash-balance-factor=0"]).0.hash_balance.is_on(),
        "0 = off"
    );
    let (k, w) = routing(&[
        "--hash-balance-factor=0.5",
        "--hash-balance-floor=-1",
        "--cache-aware-balance-factor=0.9",
        "--session-balance-factor=x",
        "--cache-aware-index-budget=lots",
    ]);
    assert_eq!(k, RoutingKnobs::DEFAULT);
    assert_eq!(
        w,
        [
            "FLEXINFER_PROXY_HASH_BALANCE_FACTOR",
            "FLEXINFER_PROXY_HASH_BALANCE_FLOOR",
            "FLEXINFER_PROXY_CACHE_AWARE_BALANCE_FACTOR",
            "FLEXINFER_PROXY_SESSION_BALANCE_FACTOR",
            "FLEXINFER_PROXY_CACHE_AWARE_INDEX_BUDGET"
        ]
    );
}

#[test]
fn the_help_shows_each_default_as_a_flag_takes_it() {
    let help = ServeArgs::augment_args(clap::Command::new("serve"))
        .render_long_help()
        .to_string();
    for shown in [
        "[default: 500ms]",
        "[default: 2s]",
        "[default: 4s]",
        "[default: 5m]",
        "[default: 10m]",
        "[default: 16MiB]",
        "[default: 1.15]",
        "[default: 1.5]",
        "[default: round-robin]",
        "[default: /sys/fs/bpf/flexinfer]",
    ] {
        assert!(help.contains(shown), "{shown} missing from serve --help");
    }
}

/// `serve`'s flags with environment variables given as a map (never the process's): each
/// variable becomes its flag, which is how clap would read it.
fn serve_args_with_env(flags: &[&str], env: &[(&str, &str)]) -> Result<ServeArgs, clap::Error> {
    let env: std::collections::HashMap<&str, &str> = env.iter().copied().collect();
    let cmd = ServeArgs::augment_args(clap::Command::new("serve")).mut_args(|a| a.env(None));
    let mut argv = vec!["serve".to_owned()];
    for a in ServeArgs::augment_args(clap::Command::new("serve")).get_arguments() {
        let var = a.get_env().and_then(|v| v.to_str());
        if let (Some(v), Some(long)) = (var.and_then(|v| env.get(v)), a.get_long()) {
            argv.push(format!("--{long}={v}"));
        }
    }
    argv.extend(flags.iter().map(|s| (*s).to_owned()));
    let matches = cmd.try_get_matches_from(argv)?;
    ServeArgs::from_arg_matches(&matches)
}

fn signals(flags: &[&str], env: &[(&str, &str)]) -> Result<SignalSettings, clap::Error> {
    serve_args_with_env(flags, env).map(|a| Settings::from_args(&a).0.signals)
}

#[test]
fn engine_signals_default_to_in_band_reports_and_a_scrape_budget_of_one() {
    let s = signals(&[], &[]).unwrap();
    assert!(s.inband);
    assert_eq!(s.staleness, Duration::from_secs(30));
    let scrape = s.scrape.unwrap();
    assert_eq!(scrape.budget, 1.0);
    assert_eq!(scrape.path, "/metrics");
    assert_eq!(scrape.max_report_age, Duration::from_secs(60));
    assert_eq!((s.fleet_size, s.fleet_rank), (0, 0));
}

#[test]
fn engine_signal_flags_and_environment() {
    let s = signals(
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
            ("FLEXINFER_PROXY_FLEET_RANK", "3"),
        ],
    )
    .unwrap();
    assert!(!s.inband);
    assert_eq!(s.staleness, Duration::from_millis(1500));
    assert_eq!((s.fleet_size, s.fleet_rank), (10, 3));
    let scrape = s.scrape.unwrap();
    assert_eq!((scrape.budget, scrape.path.as_str()), (0.5, "/v1/metrics"));
    let off = signals(&[], &[("FLEXINFER_PROXY_ENGINE_SCRAPE_BUDGET", "0")]).unwrap();
    assert!(off.scrape.is_none());
}

#[test]
fn bad_engine_signal_values_are_refused_with_the_reason() {
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
        let e = signals(args, &[]).unwrap_err().to_string();
        assert!(e.contains(why), "{args:?}: {e}");
    }
}

fn kube_options(flags: &[&str], env: &[(&str, &str)]) -> Result<KubeOptions, clap::Error> {
    let mut argv = vec!["--discovery", "kubernetes"];
    argv.extend_from_slice(flags);
    serve_args_with_env(&argv, env).map(|a| match Settings::from_args(&a).0.discovery {
        DiscoverySettings::Kubernetes(o) => o,
        other => panic!("{other:?}"),
    })
}

#[test]
fn the_fleet_is_the_charts_proxy_pods_in_the_service_accounts_namespace_by_default() {
    let d = kube_options(&[], &[]).unwrap();
    assert_eq!(
        d.fleet,
        FleetOptions {
            selector: "app.kubernetes.io/name=flexinfer-proxy".into(),
            namespace: None,
            pod_name: None,
        }
    );
    let set = kube_options(
        &["--fleet-selector", "app=proxy,release=r"],
        &[("FLEXINFER_PROXY_FLEET_NAMESPACE", "flexinfer-system")],
    )
    .unwrap();
    assert_eq!(set.fleet.selector, "app=proxy,release=r");
    assert_eq!(set.fleet.namespace.as_deref(), Some("flexinfer-system"));
    let named = kube_options(&[], &[("FLEXINFER_PROXY_FLEET_POD_NAME", "proxy-x7k")]).unwrap();
    assert_eq!(named.fleet.pod_name.as_deref(), Some("proxy-x7k"));
    let e = kube_options(&["--fleet-selector", ""], &[]).unwrap_err();
    assert!(e.to_string().contains("every pod"), "{e}");
}

/// The compression of trace exports: the traces variable wins, an unknown value is ignored with
/// a warning that names its variable.
#[test]
fn trace_compression_variables() {
    let of = |env: &[(&str, &str)]| {
        let (s, w) = Settings::from_args(&serve_args_with_env(&[], env).unwrap());
        (s.trace.compression, w)
    };
    assert_eq!(of(&[]).0, Compression::None);
    assert_eq!(
        of(&[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")]).0,
        Compression::Gzip
    );
    let both = [
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none"),
    ];
    assert_eq!(of(&both).0, Compression::None);
    let (c, w) = of(&[("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "zstd")]);
    assert_eq!(c, Compression::None);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].knob, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION");
    assert!(w[0].value.contains("zstd"), "{w:?}");
}

/// The exporter's timeout variables: the traces one wins, and the shorter of it and the batch
/// processor's export timeout bounds an export.
#[test]
fn trace_timeout_variables() {
    let of = |env: &[(&str, &str)]| {
        let (s, _) = Settings::from_args(&serve_args_with_env(&[], env).unwrap());
        s.trace.export_timeout
    };
    assert_eq!(of(&[]), Duration::from_secs(10));
    assert_eq!(
        of(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")]),
        Duration::from_millis(2500)
    );
    let both = [
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "4000"),
    ];
    assert_eq!(of(&both), Duration::from_secs(4));
    let longer = [
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "3000"),
    ];
    assert_eq!(of(&longer), Duration::from_secs(3));
    assert!(serve_args_with_env(&[], &[("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")]).is_err());
}

/// http/protobuf is accepted silently; any other protocol warns, naming its variable.
#[test]
fn trace_protocol_variables() {
    let warned = |env: &[(&str, &str)]| {
        let (_, w) = Settings::from_args(&serve_args_with_env(&[], env).unwrap());
        w.iter()
            .map(|w| (w.knob, w.value.clone()))
            .collect::<Vec<_>>()
    };
    assert!(warned(&[]).is_empty());
    assert!(warned(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).is_empty());
    let w = warned(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].0, "OTEL_EXPORTER_OTLP_PROTOCOL");
    assert!(w[0].1.contains("grpc"), "{w:?}");
    let both = [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
    ];
    assert!(warned(&both).is_empty());
    let w = warned(&[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")]);
    assert_eq!(w[0].0, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL");
}
