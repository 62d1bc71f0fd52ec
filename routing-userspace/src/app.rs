//! `flexinfer-proxy serve`: wire settings, gauge, discovery and the two listeners together.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::config::{DiscoveryKind, GaugeKind, KeepAlive, RoutingKnobs, ServeArgs};
use crate::load::reservations::ReservationLedger;
use crate::load::userspace::UserspaceGauge;
use crate::load::LoadGauge;
use crate::metrics::Metrics;
use crate::proxy::upstream::{OnConnect, Upstream};
use crate::state::{RequestLimits, Shared};
use crate::{admin, proxy};

/// The gauge least-loaded picks read, and whether it is the eBPF one.
fn choose_gauge(
    args: &ServeArgs,
    userspace: &Arc<UserspaceGauge>,
) -> anyhow::Result<(Arc<dyn LoadGauge>, bool)> {
    if args.ebpf.gauge == GaugeKind::Userspace {
        if args.ebpf.require_ebpf {
            bail!("--require-ebpf conflicts with --gauge userspace");
        }
        return Ok((userspace.clone(), false));
    }
    match crate::load::open_ebpf_gauge(&args.ebpf) {
        Ok(g) => {
            tracing::info!("eBPF connection gauge loaded; least-loaded picks read it");
            Ok((g, true))
        }
        Err(why) if args.ebpf.require_ebpf || args.ebpf.gauge == GaugeKind::Ebpf => {
            bail!("eBPF gauge required but unavailable: {why}")
        }
        Err(why) => {
            tracing::warn!(reason = %why, "eBPF gauge unavailable; using the userspace in-flight gauge");
            Ok((userspace.clone(), false))
        }
    }
}

pub async fn serve(
    args: ServeArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (knobs, warnings) = RoutingKnobs::from_raw(&args.routing);
    for w in &warnings {
        tracing::warn!(knob = w.knob, value = %w.value, using = %w.used, "invalid routing knob; using the default");
    }
    let metrics = Arc::new(Metrics::with_key_tracking(args.key_tracking()));
    let inflight = Arc::new(UserspaceGauge::default());
    let (pick_gauge, ebpf) = choose_gauge(&args, &inflight)?;
    metrics.ebpf_enabled.set(i64::from(ebpf));
    let keepalive = match args.upstream_keepalive {
        KeepAlive::On => true,
        KeepAlive::Off => false,
        KeepAlive::Auto => !ebpf,
    };
    tracing::info!(
        gauge = pick_gauge.name(),
        upstream_keepalive = keepalive,
        explicit_key_max_length = knobs.limits.explicit_key_max_length,
        system_segment_max_length = knobs.limits.system_segment_max_length,
        document_segment_max_length = knobs.limits.document_segment_max_length,
        reservation_ttl = ?knobs.reservation_ttl,
        label_group_mode = %knobs.label_group_mode,
        "settings"
    );
    // With one connection per request on the eBPF gauge, a pod's reservation is replaced when
    // the kernel starts counting the connection: when connect() returns.
    let pod_ledger = Arc::new(ReservationLedger::new(knobs.reservation_ttl));
    let on_connect: Option<OnConnect> = (ebpf && !keepalive).then(|| {
        let ledger = pod_ledger.clone();
        Arc::new(move |peer: std::net::SocketAddr| {
            ledger.consume(&peer, Instant::now());
        }) as OnConnect
    });
    let shared = Arc::new(Shared::new(
        knobs,
        metrics,
        pick_gauge,
        inflight,
        pod_ledger,
        Upstream::new(args.connect_timeout, keepalive, on_connect),
        RequestLimits {
            max_body_bytes: args.max_body_bytes,
            max_pod_attempts: args.max_pod_attempts,
        },
    ));

    let (tx, mut rx) = mpsc::unbounded_channel();
    match args.discovery {
        DiscoveryKind::File => {
            let path = args
                .config
                .clone()
                .context("--config (FLEXINFER_PROXY_CONFIG) is required with --discovery file")?;
            crate::discovery::file::start(path, args.config_poll, tx)
                .map_err(anyhow::Error::msg)?;
        }
        DiscoveryKind::Kubernetes => crate::discovery::start_kubernetes(&args, tx)?,
    }
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
    let sweeper = shared.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            sweeper.sweep_reservations(Instant::now());
        }
    });

    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let admin_listener = TcpListener::bind(args.admin_listen)
        .await
        .with_context(|| format!("cannot listen on {} (admin)", args.admin_listen))?;
    tracing::info!(listen = %listener.local_addr()?, admin = %admin_listener.local_addr()?, "flexinfer-proxy serving");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let admin_shared = shared.clone();
    let admin_task = tokio::spawn(proxy::server::serve(
        admin_listener,
        move |req, _peer| admin::handle(admin_shared.clone(), req),
        stopped(stop_rx.clone()),
        Duration::from_secs(1),
    ));
    let proxy_shared = shared.clone();
    proxy::server::serve(
        listener,
        move |req, peer| proxy::handle(proxy_shared.clone(), req, peer),
        stopped(stop_rx),
        args.drain_timeout,
    )
    .await?;
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
