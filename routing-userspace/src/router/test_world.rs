//! The fixture the router's tests share: models turned into a routing table, gauge slots and a
//! userspace gauge, with a router over them, built the way the proxy builds them.

use std::borrow::Borrow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::HeaderMap;

use super::{Decision, Router, RoutingKnobs};
use crate::body::BodyFields;
use crate::discovery::ModelSpec;
use crate::keys::RequestParts;
use crate::load::slots::SlotAllocator;
use crate::load::userspace::UserspaceGauge;
use crate::metrics::Metrics;
use crate::table::RoutingTable;
use crate::vocab::Strategy;

pub(super) struct World {
    pub table: RoutingTable,
    pub gauge: Arc<UserspaceGauge>,
    pub router: Router,
    pub slots: SlotAllocator,
}

/// A pod on loopback, named by its port.
pub(super) fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A model with a Service and one pod per port.
pub(super) fn model<P: Borrow<u16>>(
    name: &str,
    routing: Strategy,
    ports: impl IntoIterator<Item = P>,
) -> ModelSpec {
    let mut m = ModelSpec::new(name);
    m.routing = routing;
    m.service = Some(format!("http://{name}.svc:80"));
    m.endpoints = ports.into_iter().map(|p| addr(*p.borrow())).collect();
    m
}

impl World {
    /// `models` as discovery would report them, routed with `knobs`.
    pub(super) fn new(models: Vec<ModelSpec>, knobs: RoutingKnobs) -> World {
        let (table, slots) =
            RoutingTable::of_models(models, &Metrics::new(100), knobs.label_group_mode);
        let gauge = Arc::new(UserspaceGauge::default());
        World {
            table,
            router: Router::new(gauge.clone(), knobs),
            gauge,
            slots,
        }
    }

    /// The same world, its router one of `proxies` in front of the pods (a new router counts
    /// itself alone), the first of them.
    pub(super) fn in_fleet(self, proxies: usize) -> World {
        self.in_fleet_at(proxies, 0)
    }

    /// The same world, its router the one of rank `rank` among `proxies`.
    pub(super) fn in_fleet_at(mut self, proxies: usize, rank: usize) -> World {
        self.router
            .set_fleet(crate::signals::fleet::FleetPlace::fixed(proxies, rank));
        self
    }

    /// The decision for a request to `name` with these headers and body (`draw` is the
    /// request's random draw).
    pub(super) fn decide(
        &self,
        name: &str,
        headers: &HeaderMap,
        body: &str,
        draw: u64,
    ) -> Decision {
        let fields = BodyFields::parse(body.as_bytes());
        let parts = RequestParts {
            headers,
            body: fields.as_ref(),
            model: Some(name),
        };
        let route = self.table.lookup(name).expect("route");
        self.router.decide(&route, &parts, draw, Instant::now())
    }

    /// The decision for a request with no headers and draw 0.
    pub(super) fn simple(&self, name: &str, body: &str) -> Decision {
        self.decide(name, &HeaderMap::new(), body, 0)
    }
}
