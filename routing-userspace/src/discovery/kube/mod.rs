//! Kubernetes discovery (`--discovery kubernetes`): Model custom resources, their Services and
//! EndpointSlices (or the Gateway API InferencePools they name, and those pools' Pods), watched
//! with kube-rs, turned into [`Update`]s.
//!
//! Conventions (see docs/kubernetes.md):
//! - a Model is served by the Service of the same name in its namespace, unless the annotation
//!   `flexinfer.ai/service-name` names another;
//! - a Model with `spec.inferencePoolRef` takes its pods from that InferencePool instead of the
//!   Service's EndpointSlices; the Service stays its fallback;
//! - the shared service label is the Model's metadata label `flexinfer.ai/service` (the key is
//!   configurable), a label so that `kubectl get models -l flexinfer.ai/service=chat` lists a group;
//! - the first [`Update::Reset`] goes out once Models, Services, EndpointSlices and
//!   InferencePools (and Pods, when a Model names a pool) have all been listed; that is what
//!   readiness waits for. Broken watches relist without emptying the table. A cluster without
//!   the InferencePool CRD has no pools; that does not hold readiness back;
//! - the proxy DaemonSet's own Pods are counted ([`fleet`]), when the caller asks, so the engine
//!   scraper spreads its reads over the fleet; that watch never holds readiness back either.

pub mod admission;
pub mod crd;
pub mod fleet;
pub mod pods;
pub mod pool;
pub mod translate;
pub mod watch;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod testserver;

use crate::signals::fleet::FleetPlace;
use std::fmt::Debug;
use std::path::PathBuf;

use anyhow::Context as _;
use futures::stream::{AbortHandle, BoxStream};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::NamespaceResourceScope;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Config, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::UnboundedSender;
use tracing::{debug, warn};

pub use crd::Model;
pub use fleet::{FleetOptions, DEFAULT_FLEET_SELECTOR};
pub use pool::InferencePool;
pub use translate::DEFAULT_SERVICE_LABEL_KEY;
use watch::{slim, Discovery, Ev};

use super::Update;

/// How to reach the cluster and what to watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeOptions {
    /// Watch one namespace; None watches all.
    pub namespace: Option<String>,
    /// A kubeconfig file; None tries in-cluster config, then the default kubeconfig.
    pub kubeconfig: Option<PathBuf>,
    /// The Model metadata label carrying the shared service label (default `flexinfer.ai/service`).
    pub service_label_key: String,
    /// Watch InferencePools, and the Pods of the pools Models name (default on).
    pub inference_pools: bool,
    /// The proxy's own pods, counted when [`run`] is given a fleet count to store into.
    pub fleet: FleetOptions,
}

impl Default for KubeOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            kubeconfig: None,
            service_label_key: DEFAULT_SERVICE_LABEL_KEY.to_owned(),
            inference_pools: true,
            fleet: FleetOptions::default(),
        }
    }
}

/// Connects (kubeconfig, else in-cluster, else the default kubeconfig) and runs discovery forever;
/// with `fleet`, it also counts the proxies of the fleet into it (see [`run_with_client`]).
pub async fn run(
    opts: KubeOptions,
    updates: UnboundedSender<Update>,
    fleet: Option<FleetPlace>,
) -> anyhow::Result<()> {
    let config = match &opts.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => match Config::incluster() {
            Ok(c) => c,
            Err(in_cluster) => Config::from_kubeconfig(&KubeConfigOptions::default())
                .await
                .with_context(|| {
                    format!("not in a cluster ({in_cluster}) and no usable default kubeconfig")
                })?,
        },
    };
    run_with_client(client(config)?, opts, updates, fleet).await
}

/// Builds a client. kube's TLS takes rustls' process-wide crypto provider, and rustls panics when
/// the build enabled two providers and none was chosen; pin ring so another crate pulling in
/// aws-lc-rs cannot turn that into a crash at startup.
fn client(config: Config) -> anyhow::Result<Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::try_from(config).context("building the Kubernetes client")
}

fn api<K>(client: &Client, opts: &KubeOptions) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    // An empty namespace (FLEXINFER_PROXY_NAMESPACE="") means all, like None.
    match opts.namespace.as_deref().filter(|ns| !ns.is_empty()) {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// One item of the merged watch streams: an event, or a watch error and which watch it was.
type Item = Result<Ev, (&'static str, watcher::Error)>;

fn watch<K>(
    what: &'static str,
    api: Api<K>,
    config: watcher::Config,
    ev: fn(watcher::Event<K>) -> Ev,
) -> BoxStream<'static, Item>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher(api, config)
        .default_backoff()
        .map(move |r| r.map(ev).map_err(|e| (what, e)))
        .boxed()
}

/// The HTTP status of a watch error the API server answered, else 0.
fn status_code(e: &watcher::Error) -> u16 {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => 0,
    }
}

/// What an operator can do about a watch error, for the two common setup mistakes.
fn hint(what: &str, e: &watcher::Error) -> &'static str {
    match (status_code(e), what) {
        (403, _) => "RBAC: the proxy needs get/list/watch on models.inference.flexinfer.ai, endpointslices.discovery.k8s.io and services, and with --inference-pools also on inferencepools.inference.networking.k8s.io and pods",
        (404, "models") => "is the Model CRD (models.inference.flexinfer.ai) installed?",
        _ => "",
    }
}

/// The watches that always run: Models, Services, EndpointSlices, and InferencePools when
/// `opts.inference_pools` (a 404 there means no pools: [`Ev::PoolsAbsent`]).
fn base_watches(client: &Client, opts: &KubeOptions) -> Vec<BoxStream<'static, Item>> {
    let config = watcher::Config::default();
    let mut streams = vec![
        watch(
            "models",
            api::<Model>(client, opts),
            config.clone(),
            Ev::Model,
        ),
        watch(
            "services",
            api::<Service>(client, opts),
            config.clone(),
            Ev::Service,
        ),
        watch(
            "endpointslices",
            api::<EndpointSlice>(client, opts),
            config.clone().labels(translate::SLICE_SERVICE_LABEL),
            Ev::Slice,
        ),
    ];
    if opts.inference_pools {
        let pools = watch(
            "inferencepools",
            api::<InferencePool>(client, opts),
            config,
            |e| Ev::Pool(slim(e)),
        )
        .map(|item| match item {
            Err((_, e)) if status_code(&e) == 404 => Ok(Ev::PoolsAbsent),
            other => other,
        });
        streams.push(pools.boxed());
    }
    streams
}

/// The Running Pods of the watched namespaces, slimmed to what pool selection needs.
fn pod_watch(client: &Client, opts: &KubeOptions) -> BoxStream<'static, Item> {
    let config = watcher::Config::default().fields(pods::RUNNING_PODS);
    watch("pods", api::<Pod>(client, opts), config, |e| {
        Ev::Pod(pods::pod_event(e))
    })
}

/// Runs discovery with a given client until the receiver of `updates` goes away, and, with
/// `fleet`, counts the proxies of `opts.fleet` into it meanwhile (`None`: `--fleet-size` or
/// nothing decides the fleet size, and the proxy's own pods are not watched).
pub async fn run_with_client(
    client: Client,
    opts: KubeOptions,
    updates: UnboundedSender<Update>,
    fleet: Option<FleetPlace>,
) -> anyhow::Result<()> {
    let counting = match fleet {
        Some(n) => fleet::count(client.clone(), opts.fleet.clone(), n).boxed(),
        None => futures::future::pending().boxed(),
    };
    // The fleet watch retries for ever; should it end, discovery goes on alone.
    let counting = counting.then(|()| futures::future::pending::<()>());
    tokio::select! {
        r = discover(client, opts, updates) => r,
        () = counting => unreachable!("pending never resolves"),
    }
}

/// Model discovery proper.
///
/// Watch failures are retried with backoff (kube relists after 410 Gone); the last emitted table
/// stays in force meanwhile. The Pod watch runs only while [`Discovery::wants_pods`].
async fn discover(
    client: Client,
    opts: KubeOptions,
    updates: UnboundedSender<Update>,
) -> anyhow::Result<()> {
    let mut events = futures::stream::select_all(base_watches(&client, &opts));
    let mut state = Discovery::new(opts.service_label_key.clone(), opts.inference_pools);
    let mut pods: Option<AbortHandle> = None;
    while let Some(item) = events.next().await {
        match item {
            Ok(ev) => {
                for update in state.handle(ev) {
                    if updates.send(update).is_err() {
                        return Ok(());
                    }
                }
            }
            Err((what, watcher::Error::WatchError(status))) if status.code == 410 => {
                debug!(watch = %what, reason = %status.reason, "kubernetes watch expired; relisting");
            }
            Err((what, e)) => {
                warn!(watch = %what, error = %e, hint = hint(what, &e), "kubernetes watch failed; retrying, the routing table stays as it is")
            }
        }
        match (state.wants_pods(), &pods) {
            (true, None) => {
                debug!("a Model names an InferencePool; watching Pods");
                let (stream, handle) = futures::stream::abortable(pod_watch(&client, &opts));
                events.push(stream.boxed());
                pods = Some(handle);
            }
            (false, Some(handle)) => {
                debug!("no Model names an InferencePool; no longer watching Pods");
                handle.abort();
                pods = None;
                state.stop_pods();
            }
            _ => {}
        }
    }
    anyhow::bail!("kubernetes watch streams ended")
}
