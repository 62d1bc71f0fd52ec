//! The fleet under churn: `flexinfer-proxy sim` pods listed in the models file the proxy
//! polls, and the churn thread that adds pods, removes them gracefully (out of the file, then
//! stopped once drained) and SIGKILLs them, recording each event's span.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use flexinfer_test_support::{free_port, loopback, wait_http_ok, ModelEntry, ModelsFile, Proc};

use super::gauges::{routing_view, sim_in_flight};
use super::workload::Rng;
use super::{MAX_PODS, MIN_PODS, MODELS, SIM_FLAGS};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PodState {
    Live,
    /// SIGKILLed. The models file still lists it until the next change rewrites the file.
    Killed,
    Gone,
}

pub(super) struct Pod {
    pub name: String,
    pub model: usize,
    pub addr: SocketAddr,
    pub proc: Option<Proc>,
    pub state: PodState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Kind {
    Add,
    Remove,
    Kill,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Add => "add",
            Kind::Remove => "graceful removal",
            Kind::Kill => "SIGKILL",
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Event {
    pub kind: Kind,
    pub model: usize,
    pub pod: String,
    /// When it started (add: sim started; removal: models file written; kill: the signal).
    pub at: Duration,
    /// When it was over (add: the proxy routes to it; removal: the sim exited; kill: = at).
    pub done: Duration,
    /// The sim's own in-flight gauge when it left rotation (removal) or died (kill).
    pub sim_in_flight: Option<u64>,
    pub note: String,
}

pub(super) struct Fleet {
    pub pods: Vec<Pod>,
    pub next: usize,
    pub bin: PathBuf,
    pub out: PathBuf,
    pub models_file: PathBuf,
    pub admin: SocketAddr,
}

impl Fleet {
    pub(super) fn live(&self, model: usize) -> Vec<usize> {
        (0..self.pods.len())
            .filter(|&i| self.pods[i].model == model && self.pods[i].state == PodState::Live)
            .collect()
    }

    pub(super) fn models_file(&self) -> ModelsFile {
        MODELS
            .iter()
            .enumerate()
            .map(|(m, (name, routing))| {
                let eps = self
                    .pods
                    .iter()
                    .filter(|p| p.model == m && p.state == PodState::Live);
                ModelEntry::new(name)
                    .routing(routing)
                    .endpoints(eps.map(|p| p.addr))
            })
            .collect()
    }

    /// Write the models file: the live pods. A pod killed since the last write was still
    /// listed until now (a kill alone does not touch the file, as a crashed pod would not).
    pub(super) fn write(&self) -> Result<()> {
        self.models_file().write_to(&self.models_file)?;
        Ok(())
    }

    pub(super) fn start_pod(&mut self, model: usize) -> Result<usize> {
        let name = format!("{}-{}", &MODELS[model].0["soak-".len()..], self.next);
        self.next += 1;
        let mut last = String::new();
        for _ in 0..3 {
            let addr = loopback(free_port());
            let mut cmd = Command::new(&self.bin);
            cmd.args(["sim", "--listen", &addr.to_string(), "--name", &name])
                .args(SIM_FLAGS);
            let log = self.out.join(format!("sim-{name}.log"));
            let mut p = Proc::spawn(&format!("sim {name}"), cmd, &log)?;
            match wait_http_ok(addr, "/health", Duration::from_secs(10)) {
                Ok(()) => {
                    self.pods.push(Pod {
                        name,
                        model,
                        addr,
                        proc: Some(p),
                        state: PodState::Live,
                    });
                    return Ok(self.pods.len() - 1);
                }
                Err(e) => {
                    last = format!("{e}: {}", p.log_text());
                    let _ = p.kill();
                }
            }
        }
        bail!("sim {name} did not start: {last}")
    }

    /// Wait until the proxy's table lists (or no longer lists) `addr` for `model`.
    pub(super) fn wait_table(&self, model: usize, addr: SocketAddr, listed: bool) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let want = addr.to_string();
        loop {
            let has = routing_view(self.admin).ok().is_some_and(|v| {
                v["models"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|m| m["name"] == MODELS[model].0)
                    .flat_map(|m| m["pods"].as_array().cloned().unwrap_or_default())
                    .any(|p| p["address"].as_str() == Some(want.as_str()))
            });
            if has == listed {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the proxy did not apply the models file change for {addr} in 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub(super) struct Churn {
    pub fleet: Fleet,
    pub rng: Rng,
    pub t0: Instant,
    pub events: Vec<Event>,
}

impl Churn {
    pub(super) fn add(&mut self, model: usize) -> Result<()> {
        let at = self.t0.elapsed();
        let i = self.fleet.start_pod(model)?;
        self.fleet.write()?;
        let (name, addr) = (self.fleet.pods[i].name.clone(), self.fleet.pods[i].addr);
        self.fleet.wait_table(model, addr, true)?;
        self.events.push(Event {
            kind: Kind::Add,
            model,
            pod: name,
            at,
            done: self.t0.elapsed(),
            sim_in_flight: None,
            note: String::new(),
        });
        Ok(())
    }

    /// Out of the models file, wait for the proxy to drop it and for its requests to finish,
    /// then SIGTERM.
    pub(super) fn remove(&mut self, i: usize) -> Result<()> {
        let (model, addr) = (self.fleet.pods[i].model, self.fleet.pods[i].addr);
        let at = self.t0.elapsed();
        self.fleet.pods[i].state = PodState::Gone;
        self.fleet.write()?;
        self.fleet.wait_table(model, addr, false)?;
        let in_flight_at_removal = sim_in_flight(addr);
        // Drained: two readings of 0, 100 ms apart (a request picked just before the table
        // changed may still be on its way).
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut zeros = 0;
        while zeros < 2 && Instant::now() < deadline {
            zeros = if sim_in_flight(addr) == Some(0) {
                zeros + 1
            } else {
                0
            };
            std::thread::sleep(Duration::from_millis(100));
        }
        let note = if zeros < 2 {
            "still busy after 30 s; terminated anyway".to_owned()
        } else {
            String::new()
        };
        let pod = &mut self.fleet.pods[i];
        if let Some(mut p) = pod.proc.take() {
            if p.terminate(Duration::from_secs(10)).is_none() {
                let _ = p.kill();
            }
        }
        self.events.push(Event {
            kind: Kind::Remove,
            model,
            pod: pod.name.clone(),
            at,
            done: self.t0.elapsed(),
            sim_in_flight: in_flight_at_removal,
            note,
        });
        Ok(())
    }

    pub(super) fn kill(&mut self, i: usize) -> Result<()> {
        let pod = &mut self.fleet.pods[i];
        let in_flight = sim_in_flight(pod.addr);
        // The kill spans from the signal to the reaped process: streams break inside it.
        let at = self.t0.elapsed();
        if let Some(p) = pod.proc.as_mut() {
            p.kill()?;
        }
        let done = self.t0.elapsed();
        pod.proc = None;
        pod.state = PodState::Killed;
        self.events.push(Event {
            kind: Kind::Kill,
            model: pod.model,
            pod: pod.name.clone(),
            at,
            done,
            sim_in_flight: in_flight,
            note: String::new(),
        });
        Ok(())
    }

    /// One churn event: kinds in a shuffled round of (add, remove, kill), held to the pod
    /// bounds.
    pub(super) fn step(&mut self, kind: Kind) -> Result<()> {
        let model = self.rng.below(MODELS.len() as u64) as usize;
        let live = self.fleet.live(model);
        let kind = match kind {
            Kind::Remove | Kind::Kill if live.len() <= MIN_PODS => Kind::Add,
            Kind::Add if live.len() >= MAX_PODS => Kind::Remove,
            k => k,
        };
        match kind {
            Kind::Add => self.add(model),
            Kind::Remove => {
                let i = live[self.rng.below(live.len() as u64) as usize];
                self.remove(i)
            }
            Kind::Kill => {
                let i = live[self.rng.below(live.len() as u64) as usize];
                self.kill(i)
            }
        }
    }

    pub(super) fn run(
        mut self,
        every: Duration,
        deadline: Instant,
        stop: &AtomicBool,
    ) -> Result<Self> {
        // A few seconds of steady state first.
        let mut next = Instant::now() + every;
        let mut round: Vec<Kind> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if now < next {
                std::thread::sleep((next - now).min(Duration::from_millis(50)));
                continue;
            }
            if round.is_empty() {
                round = vec![Kind::Add, Kind::Remove, Kind::Kill];
                for i in (1..round.len()).rev() {
                    round.swap(i, self.rng.below(i as u64 + 1) as usize);
                }
            }
            let kind = round.pop().expect("refilled");
            self.step(kind)?;
            let ms = every.as_millis() as u64;
            next =
                Instant::now() + Duration::from_millis(self.rng.range(ms * 7 / 10, ms * 13 / 10));
        }
        Ok(self)
    }
}
