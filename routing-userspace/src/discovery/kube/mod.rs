//! Kubernetes discovery (`--discovery kubernetes`): Model custom resources, their Services and
//! EndpointSlices, watched with kube-rs, turned into [`Update`]s.
//!
//! Conventions (see docs/kubernetes.md):
//! - a Model is served by the Service of the same name in its namespace, unless the annotation
//!   `flexinfer.ai/service-name` names another;
//! - the shared service label is the Model's metadata label `flexinfer.ai/service` (the key is
//!   configurable), a label so that `kubectl get models -l flexinfer.ai/service=chat` lists a group;
//! - the first [`Update::Reset`] goes out once Models, Services and EndpointSlices have all been
//!   listed; that is what readiness waits for. Broken watches relist without emptying the table.

pub mod admission;
pub mod crd;
pub mod translate;
pub mod watch;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod testserver;

use std::fmt::Debug;
use std::path::PathBuf;

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::NamespaceResourceScope;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Config, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::UnboundedSender;
use tracing::{debug, warn};

pub use crd::Model;
pub use translate::DEFAULT_SERVICE_LABEL_KEY;
use watch::{Discovery, Ev};

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
}

impl Default for KubeOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            kubeconfig: None,
            service_label_key: DEFAULT_SERVICE_LABEL_KEY.to_owned(),
        }
    }
}

/// Connects (kubeconfig, else in-cluster, else the default kubeconfig) and runs discovery forever.
pub async fn run(opts: KubeOptions, updates: UnboundedSender<Update>) -> anyhow::Result<()> {
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
    run_with_client(client(config)?, opts, updates).await
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

fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl futures::Stream<Item = watcher::Result<watcher::Event<K>>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher(api, config).default_backoff()
}

/// What an operator can do about a watch error, for the two common setup mistakes.
fn hint(e: &watcher::Error) -> &'static str {
    let code = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => 0,
    };
    match code {
        403 => "RBAC: the proxy needs get/list/watch on models.inference.flexinfer.ai, endpointslices.discovery.k8s.io and services",
        404 => "is the Model CRD (models.inference.flexinfer.ai) installed?",
        _ => "",
    }
}

/// Runs discovery with a given client until the receiver of `updates` goes away.
///
/// Watch failures are retried with backoff (kube relists after 410 Gone); the last emitted table
/// stays in force meanwhile.
pub async fn run_with_client(
    client: Client,
    opts: KubeOptions,
    updates: UnboundedSender<Update>,
) -> anyhow::Result<()> {
    let config = watcher::Config::default();
    let models = watch(api::<Model>(&client, &opts), config.clone()).map_ok(Ev::Model);
    let services = watch(api::<Service>(&client, &opts), config.clone()).map_ok(Ev::Service);
    let slices = watch(
        api::<EndpointSlice>(&client, &opts),
        config.labels(translate::SLICE_SERVICE_LABEL),
    )
    .map_ok(Ev::Slice);
    let mut events =
        futures::stream::select_all([models.boxed(), services.boxed(), slices.boxed()]);
    let mut state = Discovery::new(opts.service_label_key);
    while let Some(event) = events.next().await {
        match event {
            Ok(ev) => {
                for update in state.handle(ev) {
                    if updates.send(update).is_err() {
                        return Ok(());
                    }
                }
            }
            Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                debug!(reason = %status.reason, "kubernetes watch expired; relisting");
            }
            Err(e) => {
                warn!(error = %e, hint = hint(&e), "kubernetes watch failed; retrying, the routing table stays as it is")
            }
        }
    }
    anyhow::bail!("kubernetes watch streams ended")
}
