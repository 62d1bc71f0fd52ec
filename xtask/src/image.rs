//! `cargo xtask image`: build the container image the Helm chart deploys.
//!
//! With a registry in reach the Dockerfile does everything (its builder stage compiles the eBPF
//! object and the proxy with the pinned toolchains), exactly as `docker build .` would. Without
//! one no base image can be pulled, so the proxy is built here and packaged by the Dockerfile's
//! `runtime-prebuilt` stage on a Debian base made with debootstrap. Either way the binary is
//! profile-guided (`cargo xtask pgo`, in the builder stage or here) unless `--no-pgo`, and the image is
//! tagged `ghcr.io/flexinfer/flexinfer-proxy:<chart appVersion>` and smoke-tested with
//! `--version` through its own entrypoint.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use xtask::container::{self, Engine, EngineChoice, Prebuilt};
use xtask::paths::{chart_app_version, crate_version, workspace_root};

use crate::ebpf::{self};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BaseChoice {
    /// The Dockerfile's base images when the registry answers, else `local`.
    Auto,
    /// Pull the Dockerfile's base images.
    Registry,
    /// A Debian base made with debootstrap (no registry needed; implies --prebuilt).
    Local,
}

#[derive(clap::Args)]
pub(crate) struct Image {
    /// Container engine.
    #[arg(long, value_enum, default_value = "auto")]
    pub engine: EngineChoice,
    /// Where the base images come from.
    #[arg(long, value_enum, default_value = "auto")]
    pub base: BaseChoice,
    /// Build the binary on this machine (profile-guided unless --no-pgo) and package it, instead
    /// of building it in the Dockerfile's builder stage.
    #[arg(long)]
    pub prebuilt: bool,
    /// Ship the plain release build (whole-program LTO) instead of the profile-guided one:
    /// about 7 min on 2 cores instead of 20, and short requests about 4% slower.
    #[arg(long)]
    pub no_pgo: bool,
    /// Image name (default: ghcr.io/flexinfer/flexinfer-proxy:<chart appVersion>).
    #[arg(long)]
    pub tag: Option<String>,
}

pub(crate) fn run(args: &Image) -> Result<()> {
    let t = Instant::now();
    let version = chart_app_version()?;
    let crate_version = crate_version()?;
    if version != crate_version {
        bail!("the chart's appVersion {version} differs from the crate version {crate_version}: bump both");
    }
    let tag = args
        .tag
        .clone()
        .unwrap_or_else(|| format!("{}:{version}", container::DEFAULT_REPOSITORY));
    let engine = Engine::detect(args.engine)?;
    println!("image: engine {}", engine.name());
    let runtime_base = container::dockerfile_arg("RUNTIME_BASE")?;
    let local = match args.base {
        BaseChoice::Local => true,
        BaseChoice::Registry => false,
        BaseChoice::Auto => {
            let reachable = engine.can_get(&runtime_base);
            if !reachable {
                println!("image: cannot pull {runtime_base}: using the local Debian base");
            }
            !reachable
        }
    };
    let pgo = !args.no_pgo;
    if !local && !args.prebuilt {
        build_from_source(&engine, &tag, &version, pgo)?;
    } else {
        let base = if local {
            container::ensure_local_base(&engine)?;
            Some(container::LOCAL_BASE)
        } else {
            None
        };
        let binary = if pgo {
            crate::pgo::run(&crate::pgo::Pgo::default())?
        } else {
            ebpf::release_proxy(true, true)?
        };
        println!("image: packaging {}", binary.display());
        container::build_prebuilt(
            &engine,
            &Prebuilt {
                binary: &binary,
                tag: &tag,
                base,
                version: &version,
            },
        )?;
    }
    let reported = container::smoke_test(&engine, &tag)?;
    if reported != format!("flexinfer-proxy {version}") {
        bail!("{tag} --version printed {reported:?}, expected flexinfer-proxy {version}");
    }
    let size = engine.image_size(&tag)?;
    println!(
        "image: {tag} ({:.1} MB) built in {:.0}s; it runs: {reported}",
        size as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The whole Dockerfile, from the repository root as context (`.dockerignore` keeps `target/`
/// and `.git` out).
fn build_from_source(engine: &Engine, tag: &str, version: &str, pgo: bool) -> Result<()> {
    let mut cmd = engine.command();
    cmd.arg("build")
        .arg("--file")
        .arg(container::dockerfile())
        .args(["--tag", tag])
        .arg("--build-arg")
        .arg(format!("VERSION={version}"))
        .arg("--build-arg")
        .arg(format!("PGO={}", u8::from(pgo)))
        .arg(workspace_root());
    println!("image: {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("running {} build", engine.name()))?;
    if !status.success() {
        bail!("{} build failed ({status})", engine.name());
    }
    Ok(())
}
