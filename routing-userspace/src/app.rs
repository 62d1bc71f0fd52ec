//! `flexinfer-proxy serve`: turn the command line into typed settings, open the load gauge,
//! start discovery, and run the two listeners until shutdown.
//!
//! This is the only module that decides what is fatal (the settings come from
//! `config::Settings::from_args`): a library module reports typed errors and never ends the
//! process. A discovery source that
//! fails for good ends `serve` with its error, so the binary exits non-zero.

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::admission::Admission;
use crate::config::settings::{DiscoverySettings, GaugeSettings, Settings};
use crate::config::{GaugeKind, ServeArgs};
use crate::discovery::file::LoadError;
use crate::discovery::Update;
use crate::ebpf::EbpfError;
use crate::load::ebpf::EbpfGauge;
use crate::load::userspace::UserspaceGauge;
use crate::load::LoadGauge;
use crate::metrics::Metrics;
use crate::proxy::retry_budget::RetryBudget;
use crate::proxy::server::{Drained, RefusalCounter, ServeOptions};
use crate::proxy::Shared;
use crate::router::Router;
use crate::signals::{Fleet, ScrapeConfig, ScrapeTargets, Scraper, SignalStore};
use crate::upstream::{ConnTrack, ConnectionHook, Upstream};
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
    #[error("tracing: {0}")]
    Tracing(#[from] crate::telemetry::TraceError),
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

/// Open the gauge the settings ask for: the node-wide eBPF gauge when it loads (fatal if
/// required), else this process's userspace gauge.
pub fn open_gauge(
    settings: &GaugeSettings,
    userspace: &Arc<UserspaceGauge>,
) -> Result<GaugeChoice, ServeError> {
    let fallback = || GaugeChoice {
        gauge: userspace.clone(),
        ebpf: None,
    };
    if settings.kind == GaugeKind::Userspace {
        if settings.require_ebpf {
            return Err(ServeError::RequireEbpfWithUserspace);
        }
        return Ok(fallback());
    }
    match EbpfGauge::open(&settings.ebpf) {
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
        Err(why) if settings.require_ebpf || settings.kind == GaugeKind::Ebpf => {
            Err(ServeError::EbpfRequired(why))
        }
        Err(why) => {
            tracing::warn!(reason = %why, "eBPF gauge unavailable; using the userspace in-flight gauge");
            Ok(fallback())
        }
    }
}

/// Start the discovery source. The file is read once here (a broken file is fatal at start);
/// the returned task ends only if the source fails for good. Kubernetes discovery also counts
/// the fleet's proxies into `fleet` when given one.
fn start_discovery(
    settings: &DiscoverySettings,
    tx: mpsc::UnboundedSender<Update>,
    fleet: Option<crate::signals::fleet::FleetPlace>,
) -> Result<tokio::task::JoinHandle<Result<(), ServeError>>, ServeError> {
    match settings {
        DiscoverySettings::File { path, poll } => {
            let path = path.clone().ok_or(ServeError::NoModelsFile)?;
            crate::discovery::file::start(path, *poll, tx)?;
            Ok(tokio::spawn(std::future::pending()))
        }
        DiscoverySettings::Kubernetes(opts) => {
            let opts = opts.clone();
            Ok(tokio::spawn(async move {
                crate::discovery::kube::run(opts, tx, fleet)
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
    let (mut settings, warnings) = Settings::from_args(&args);
    // What a user gets wrong is reported before anything touches the node (eBPF, ports): a
    // missing or invalid models file fails here, as loading it is discovery's first step.
    // Updates wait in the channel until the table exists.
    let (tx, rx) = mpsc::unbounded_channel();
    // One fleet size: discovery counts into it (unless --fleet-size fixes it), the scraper and
    // the admin views read it.
    let counted = matches!(settings.discovery, DiscoverySettings::Kubernetes(_));
    let fleet = Fleet::new(
        settings.signals.fleet_size,
        settings.signals.fleet_rank,
        counted,
        settings.signals.scrape.as_ref(),
    );
    let (size, rank) = (settings.signals.fleet_size, settings.signals.fleet_rank);
    if size > 0 && rank >= size {
        tracing::warn!(
            fleet_rank = rank,
            fleet_size = size,
            "--fleet-rank is past --fleet-size; it is taken modulo the pods a new prompt may go to"
        );
    }
    let discovery = start_discovery(&settings.discovery, tx, fleet.counter())?;
    if let Some(endpoint) = &settings.trace.endpoint {
        crate::telemetry::check_endpoint(endpoint)?;
        crate::telemetry::otlp::headers_from_env()
            .map_err(crate::telemetry::TraceError::Headers)?;
        if let Some(ca) = &settings.trace.ca_certificate {
            crate::telemetry::transport::check_ca_file(ca)?;
        }
    }
    fit_open_files(&mut settings.server);
    // Clients that connect before the table is ready wait in the listen backlog.
    let listener = bind(settings.listen, "proxy").await?;
    let admin_listener = bind(settings.admin_listen, "admin").await?;
    for w in &warnings {
        tracing::warn!(knob = w.knob, value = %w.value, using = %w.used, "invalid routing knob; using the default");
    }
    let mut shared = shared_state(&settings, fleet)?;
    let export = start_tracing(&settings, &mut shared)?;
    let shared = Arc::new(shared);
    start_background(&shared, rx);
    let local = |l: &TcpListener| l.local_addr().map_err(ServeError::Serve);
    tracing::info!(listen = %local(&listener)?, admin = %local(&admin_listener)?, "flexinfer-proxy serving");
    let served = run_listeners(
        &shared,
        &settings,
        listener,
        admin_listener,
        discovery,
        shutdown,
    )
    .await;
    if let Some(export) = export {
        export.shutdown(TRACE_EXPORT_SHUTDOWN).await;
    }
    served
}

/// Raise the open-files limit to the hard one and cap client connections at what fits under
/// it ([`crate::open_files`]): past the cap a client gets 503 with Retry-After, not a failed
/// accept or a 502 from a failed upstream connect.
fn fit_open_files(server: &mut ServeOptions) {
    let wanted = crate::open_files::needed_for(server.max_connections);
    let files = match crate::open_files::raise_limit(wanted) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, "could not read or raise the open-files limit");
            return;
        }
    };
    let fit = crate::open_files::client_connections_that_fit(files.now);
    if fit < server.max_connections {
        let configured = server.max_connections;
        server.max_connections = fit;
        const CAPPED: &str = "open files allow fewer client connections than \
             --max-client-connections (each holds two with its upstream): serving at most that \
             many, 503 past them; raise the nofile limit to serve more";
        // The default is a ceiling, not something asked for: said, not warned about.
        if configured == ServeOptions::PROXY.max_connections {
            tracing::info!(
                open_files = files.now,
                max_client_connections = configured,
                serving = fit,
                "{CAPPED}"
            );
        } else {
            tracing::warn!(
                open_files = files.now,
                max_client_connections = configured,
                serving = fit,
                "{CAPPED}"
            );
        }
    } else if files.now > files.before {
        tracing::info!(
            from = files.before,
            to = files.now,
            "open-files limit raised to the hard limit"
        );
    }
}

/// On exit, how long the spans still queued have to reach the collector.
const TRACE_EXPORT_SHUTDOWN: Duration = Duration::from_secs(2);

/// The tracer and its export task, when an OTLP endpoint is set.
fn start_tracing(
    settings: &Settings,
    shared: &mut Shared,
) -> Result<Option<crate::telemetry::ExportHandle>, ServeError> {
    let Some((tracer, export)) = crate::telemetry::start(&settings.trace, &shared.metrics.trace)?
    else {
        return Ok(None);
    };
    let t = &settings.trace;
    tracing::info!(
        endpoint = t.endpoint.as_deref().unwrap_or(""),
        sampler = %t.sampler,
        service = %t.service_name,
        compression = t.compression.as_str(),
        export_timeout = ?t.export_timeout,
        "exporting OpenTelemetry traces"
    );
    shared.tracer = Some(tracer);
    Ok(Some(export))
}

/// What every request shares, with the gauge opened (the one step that touches the node) and
/// the engine scraper started (when its budget is not 0), its reads spread over `fleet`.
fn shared_state(settings: &Settings, fleet: Fleet) -> Result<Shared, ServeError> {
    let metrics = Arc::new(Metrics::with_key_tracking(settings.key_tracking));
    let inflight = Arc::new(UserspaceGauge::default());
    let GaugeChoice { gauge, ebpf } = open_gauge(&settings.gauge, &inflight)?;
    metrics.ebpf_enabled.set(i64::from(ebpf.is_some()));
    let signals = Arc::new(SignalStore::new(
        settings.signals.staleness,
        inflight.clone(),
    ));
    let knobs = &settings.routing;
    tracing::info!(
        gauge = gauge.name(),
        upstream_keepalive = settings.upstream.keepalive,
        explicit_key_max_length = knobs.limits.explicit_key_max_length,
        system_segment_max_length = knobs.limits.system_segment_max_length,
        document_segment_max_length = knobs.limits.document_segment_max_length,
        reservation_ttl = ?knobs.reservation_ttl,
        label_group_mode = %knobs.label_group_mode,
        max_pod_attempts = knobs.max_pod_attempts,
        retry_on_status = %settings.retry.on_status,
        "settings"
    );
    let hook = ebpf.map(|g| Arc::new(RegisterWithGauge(g)) as Arc<dyn ConnectionHook>);
    let scrape = settings
        .signals
        .scrape
        .clone()
        .map(|cfg| start_scraper(cfg, &signals, fleet.shared(), hook.clone()));
    let mut router = Router::with_signals(gauge, signals, settings.routing, settings.ejection);
    router.set_full_when(settings.admission.full_when);
    router.set_fleet(fleet.place());
    let admission = Admission::new(settings.admission, metrics.admission.clone());
    let mut shared = Shared::new(
        router,
        admission,
        metrics,
        inflight,
        Upstream::new(settings.upstream, hook),
        settings.limits,
        RetryBudget::new(settings.retry.share, settings.retry.min_per_second),
    );
    shared.engine_load_reports = settings.signals.inband;
    shared.retry_on = settings.retry.on_status;
    shared.scrape_targets = scrape;
    shared.fleet = fleet;
    Ok(shared)
}

/// The engine scraper, as a background task: each pod's metrics page at most `budget` times a
/// second for the whole fleet (of `fleet` proxies, as `--fleet-size` or discovery says).
/// Returns the handle new tables give it their pods through.
fn start_scraper(
    cfg: ScrapeConfig,
    store: &Arc<SignalStore>,
    fleet: Arc<AtomicUsize>,
    hook: Option<Arc<dyn ConnectionHook>>,
) -> ScrapeTargets {
    let scraper = Scraper::new(cfg, Arc::clone(store), fleet, hook);
    let targets = scraper.targets();
    tokio::spawn(scraper.run());
    targets
}

/// Discovery updates into new tables, and the once-a-second housekeeping (reservation expiry,
/// idle upstream connections). The first update is applied at once, so a file-configured proxy
/// is ready when it starts listening.
fn start_background(shared: &Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Update>) {
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
}

/// Serve both listeners until shutdown (or until discovery fails for good).
///
/// Shutdown: /readyz answers 503 at once while the proxy keeps serving for the shutdown delay
/// (so Kubernetes takes the endpoint out), then the proxy stops accepting and lets requests in
/// flight finish for up to the drain timeout; the admin listener (metrics, /readyz) stays up
/// until then.
async fn run_listeners(
    shared: &Arc<Shared>,
    settings: &Settings,
    listener: TcpListener,
    admin_listener: TcpListener,
    discovery: tokio::task::JoinHandle<Result<(), ServeError>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let stop_rx = stop_after_delay(
        shared.clone(),
        settings.shutdown_delay,
        settings.server.drain,
        shutdown,
    );
    let (admin_stop_tx, admin_stop_rx) = tokio::sync::watch::channel(false);
    let admin_shared = shared.clone();
    let admin_task = tokio::spawn(proxy::server::serve(
        admin_listener,
        move |req, _peer| admin::handle(admin_shared.clone(), req),
        stopped(admin_stop_rx),
        ServeOptions::ADMIN,
        RefusalCounter::default(),
    ));
    let proxy_shared = shared.clone();
    let serving = proxy::server::serve(
        listener,
        move |req, peer| proxy::handle(proxy_shared.clone(), req, peer),
        stopped(stop_rx),
        settings.server,
        RefusalCounter::new(shared.metrics.requests.client_refusals_total.clone()),
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

/// On `shutdown`: not ready at once, then, after `delay`, the proxy listener stops accepting
/// (the returned receiver turns true) and the admission queues close: requests waiting in
/// them are still admitted as room appears for the first half of the drain timeout, then
/// answered 503 `proxy_shutdown` (the second half lets the last admitted ones finish).
fn stop_after_delay(
    shared: Arc<Shared>,
    delay: Duration,
    drain: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::sync::watch::Receiver<bool> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        shared.start_draining();
        tracing::info!(?delay, "not ready; still serving for the shutdown delay");
        tokio::time::sleep(delay).await;
        tracing::info!("no longer accepting; draining requests in flight");
        let _ = stop_tx.send(true);
        let deadline = tokio::time::Instant::now() + drain / 2;
        let answered = shared.admission.close(deadline).await;
        if answered > 0 {
            tracing::warn!(answered, "queued requests answered 503 on shutdown");
        }
    });
    stop_rx
}

/// Resolves once `rx` turns true.
async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
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
