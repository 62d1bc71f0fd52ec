//! `flexinfer-proxy serve`: turn the command line into typed settings, open the load gauge,
//! start discovery, and run the two listeners until shutdown.
//!
//! This is the only module that reads the CLI structs as a whole and decides what is fatal: a
//! library module reports typed errors and never ends the process. A discovery source that
//! fails for good ends `serve` with its error, so the binary exits non-zero.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::config::{DiscoveryKind, GaugeKind, KeepAlive, RoutingKnobs, ServeArgs};
use crate::discovery::file::LoadError;
use crate::discovery::kube::KubeOptions;
use crate::discovery::Update;
use crate::ebpf::EbpfError;
use crate::ebpf::EbpfGauge;
use crate::load::userspace::UserspaceGauge;
use crate::load::LoadGauge;
use crate::metrics::{KeyTracking, Metrics};
use crate::proxy::retry_budget::RetryBudget;
use crate::proxy::server::{Drained, ServeOptions};
use crate::router::health::EjectionPolicy;
use crate::router::Router;
use crate::state::{RequestLimits, Shared};
use crate::upstream::{ConnTrack, ConnectionHook, Upstream, UpstreamOptions};
use crate::{admin, proxy};

/// Why `serve` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("--require-ebpf conflicts with --gauge userspace")]
    RequireEbpfWithUserspace,
    #[error("eBPF gauge required but unavailable: {0}")]
    EbpfRequired(#[source] EbpfError),
    #[error("--config (FLEXINFER_PROXY_CONFIG) is required with --discovery file")]
    NoModelsFile,
    #[error(transparent)]
    ModelsFile(#[from] LoadError),
    #[error("kubernetes discovery failed: {0:#}")]
    Kubernetes(anyhow::Error),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Listen {
        addr: SocketAddr,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("serving failed: {0}")]
    Serve(std::io::Error),
}

/// Which gauge least-loaded picks read: the eBPF one when it loaded.
pub struct GaugeChoice {
    pub gauge: Arc<dyn LoadGauge>,
    pub ebpf: Option<Arc<EbpfGauge>>,
}

/// Registers each new upstream connection with the eBPF gauge, so its requests are counted
/// node-wide as they start and end.
struct RegisterWithGauge(Arc<EbpfGauge>);

impl ConnectionHook for RegisterWithGauge {
    fn connected(&self, stream: &tokio::net::TcpStream, _peer: SocketAddr) -> Option<ConnTrack> {
        use std::os::fd::AsFd;
        self.0.register(stream.as_fd())
    }
}

/// Open the gauge `args` asks for: the node-wide eBPF gauge when it loads (fatal if required),
/// else this process's userspace gauge.
pub fn open_gauge(
    args: &crate::config::EbpfArgs,
    userspace: &Arc<UserspaceGauge>,
) -> Result<GaugeChoice, ServeError> {
    let fallback = || GaugeChoice {
        gauge: userspace.clone(),
        ebpf: None,
    };
    if args.gauge == GaugeKind::Userspace {
        if args.require_ebpf {
            return Err(ServeError::RequireEbpfWithUserspace);
        }
        return Ok(fallback());
    }
    match crate::ebpf::EbpfGauge::open(&args.options()) {
        Ok(g) => {
            tracing::info!(
                "eBPF gauge loaded; least-loaded picks read the node-wide requests in flight"
            );
            let g = Arc::new(g);
            Ok(GaugeChoice {
                gauge: g.clone(),
                ebpf: Some(g),
            })
        }
        Err(why) if args.require_ebpf || args.gauge == GaugeKind::Ebpf => {
            Err(ServeError::EbpfRequired(why))
        }
        Err(why) => {
            tracing::warn!(reason = %why, "eBPF gauge unavailable; using the userspace in-flight gauge");
            Ok(fallback())
        }
    }
}

/// The key tracking settings of the flags.
pub fn key_tracking(args: &ServeArgs) -> KeyTracking {
    KeyTracking {
        cardinality_cap: args.key_cardinality_cap,
        cardinality_window: Some(args.key_cardinality_window),
        hot_keys: args.hot_keys,
        hot_keys_half_life: Some(args.hot_keys_half_life),
    }
}

/// Start the discovery source. The file is read once here (a broken file is fatal at start);
/// the returned task ends only if the source fails for good.
fn start_discovery(
    args: &ServeArgs,
    tx: mpsc::UnboundedSender<Update>,
) -> Result<tokio::task::JoinHandle<Result<(), ServeError>>, ServeError> {
    match args.discovery {
        DiscoveryKind::File => {
            let path = args.config.clone().ok_or(ServeError::NoModelsFile)?;
            crate::discovery::file::start(path, args.config_poll, tx)?;
            Ok(tokio::spawn(std::future::pending()))
        }
        DiscoveryKind::Kubernetes => {
            let opts = KubeOptions {
                namespace: Some(args.namespace.clone()).filter(|n| !n.is_empty()),
                kubeconfig: args.kubeconfig.clone(),
                service_label_key: args.service_label_key.clone(),
                inference_pools: args.inference_pools,
            };
            Ok(tokio::spawn(async move {
                crate::discovery::kube::run(opts, tx)
                    .await
                    .map_err(ServeError::Kubernetes)
            }))
        }
    }
}

async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Listen { addr, what, source })
}

/// After the drain timeout, how long streams cut by it have to write their final event.
const DRAIN_CUT_GRACE: Duration = Duration::from_millis(200);

pub async fn serve(
    args: ServeArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    // What a user gets wrong is reported before anything touches the node (eBPF, ports): a
    // missing or invalid models file fails here, as loading it is discovery's first step.
    // Updates wait in the channel until the table exists.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let discovery = start_discovery(&args, tx)?;
    // Clients that connect before the table is ready wait in the listen backlog.
    let listener = bind(args.listen, "proxy").await?;
    let admin_listener = bind(args.admin_listen, "admin").await?;
    let (mut knobs, warnings) = RoutingKnobs::from_raw(&args.routing);
    knobs.max_pod_attempts = usize::from(args.max_pod_attempts);
    for w in &warnings {
        tracing::warn!(knob = w.knob, value = %w.value, using = %w.used, "invalid routing knob; using the default");
    }
    let metrics = Arc::new(Metrics::with_key_tracking(key_tracking(&args)));
    let inflight = Arc::new(UserspaceGauge::default());
    let GaugeChoice { gauge, ebpf } = open_gauge(&args.ebpf, &inflight)?;
    metrics.ebpf_enabled.set(i64::from(ebpf.is_some()));
    let keepalive = args.upstream_keepalive != KeepAlive::Off;
    tracing::info!(
        gauge = gauge.name(),
        upstream_keepalive = keepalive,
        explicit_key_max_length = knobs.limits.explicit_key_max_length,
        system_segment_max_length = knobs.limits.system_segment_max_length,
        document_segment_max_length = knobs.limits.document_segment_max_length,
        reservation_ttl = ?knobs.reservation_ttl,
        label_group_mode = %knobs.label_group_mode,
        max_pod_attempts = knobs.max_pod_attempts,
        "settings"
    );
    let upstream = Upstream::new(
        UpstreamOptions {
            connect_timeout: args.connect_timeout,
            keepalive,
            idle_timeout: args.upstream_idle_timeout,
            ..UpstreamOptions::default()
        },
        ebpf.map(|g| Arc::new(RegisterWithGauge(g)) as Arc<dyn ConnectionHook>),
    );
    let t = &args.timeouts;
    let r = &args.resilience;
    let ejection = EjectionPolicy {
        after_failures: r.eject_after_failures,
        base_time: r.eject_base_time,
        max_share: r.max_ejected_share.clamp(0.0, 1.0),
    };
    let shared = Arc::new(Shared::new(
        Router::with_ejection(gauge, knobs, ejection),
        metrics,
        inflight,
        upstream,
        RequestLimits {
            max_body_bytes: args.max_body_bytes,
            max_header_bytes: args.limits.max_header_bytes,
            max_json_depth: args.limits.max_json_depth,
            first_byte_timeout: t.first_byte_timeout,
            stream_idle_timeout: t.stream_idle_timeout,
            request_timeout: t.request_timeout,
        },
        RetryBudget::new(r.retry_budget, r.retry_min_per_second),
    ));

    // Apply the first update before listening, so a file-configured proxy is ready at once.
    if let Ok(first) = rx.try_recv() {
        shared.apply(first);
    }
    let reconciler = shared.clone();
    tokio::spawn(async move {
        while let Some(update) = rx.recv().await {
            reconciler.apply(update);
        }
    });
    let housekeeper = shared.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            housekeeper.router.sweep(Instant::now());
            housekeeper.upstream.purge_idle();
        }
    });

    let local = |l: &TcpListener| l.local_addr().map_err(ServeError::Serve);
    tracing::info!(listen = %local(&listener)?, admin = %local(&admin_listener)?, "flexinfer-proxy serving");

    // Shutdown: /readyz answers 503 at once while the proxy keeps serving for the shutdown
    // delay (so Kubernetes takes the endpoint out), then the proxy stops accepting and lets
    // requests in flight finish for up to the drain timeout; the admin listener (metrics,
    // /readyz) stays up until then.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let draining = shared.clone();
    let delay = args.shutdown_delay;
    tokio::spawn(async move {
        shutdown.await;
        draining
            .draining
            .store(true, std::sync::atomic::Ordering::Release);
        tracing::info!(?delay, "not ready; still serving for the shutdown delay");
        tokio::time::sleep(delay).await;
        tracing::info!("no longer accepting; draining requests in flight");
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (admin_stop_tx, admin_stop_rx) = tokio::sync::watch::channel(false);
    let admin_shared = shared.clone();
    let admin_task = tokio::spawn(proxy::server::serve(
        admin_listener,
        move |req, _peer| admin::handle(admin_shared.clone(), req),
        stopped(admin_stop_rx),
        ServeOptions::default(),
    ));
    let proxy_shared = shared.clone();
    let serving = proxy::server::serve(
        listener,
        move |req, peer| proxy::handle(proxy_shared.clone(), req, peer),
        stopped(stop_rx),
        ServeOptions {
            name: "proxy",
            drain: args.drain_timeout,
            header_read_timeout: t.header_read_timeout,
            max_head_bytes: args.limits.max_header_bytes,
            max_connections: args.limits.max_client_connections,
        },
    );
    tokio::select! {
        served = serving => {
            if served.map_err(ServeError::Serve)? == Drained::TimedOut {
                // Streams still running end with an error event, written before the exit.
                shared.drain_cut.trigger();
                tokio::time::sleep(DRAIN_CUT_GRACE).await;
            }
        }
        failed = discovery => {
            return match failed {
                Ok(Err(e)) => Err(e),
                Ok(Ok(())) => Ok(()),
                Err(join) => Err(ServeError::Kubernetes(anyhow::anyhow!("discovery task: {join}"))),
            };
        }
    }
    let _ = admin_stop_tx.send(true);
    let _ = admin_task.await;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
    }
}
