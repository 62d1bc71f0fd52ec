//! Project tasks: `cargo xtask <task>`. A thin dispatcher; each task lives in its own module.
#![forbid(unsafe_code)]

mod bench;
mod ebpf;
mod fuzz;
mod image;
mod pgo;
mod replay;
mod setup;
mod soak;
mod test;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "flexinfer-proxy project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the eBPF object (optimized: the only build the kernel's verifier accepts) and copy
    /// it to `<target>/bpf/routing-ebpf.o`, installing the nightly toolchain, rust-src and
    /// bpf-linker first if they are missing.
    BuildEbpf(ebpf::BuildEbpf),
    /// Install what building and testing the eBPF data plane needs (idempotent).
    Setup(setup::Setup),
    /// Run a criterion benchmark group.
    Bench(bench::Bench),
    /// Install what the tests need, build the eBPF object, then fmt, clippy and every test.
    Test(test::Test),
    /// Build the container image the Helm chart deploys (docker or podman), its binary
    /// profile-guided unless `--no-pgo`.
    Image(image::Image),
    /// Run the cargo-fuzz targets under tests/fuzz, one after the other (needs nightly).
    Fuzz(fuzz::Fuzz),
    /// Clients through one proxy while pods are added, removed and killed; every request
    /// accounted for.
    Soak(soak::Soak),
    /// Build a profile-guided flexinfer-proxy (`<target>/pgo/flexinfer-proxy`): an
    /// instrumented build, the overhead and stream benches' proxy rows as training, then the
    /// build that uses the profile. Measure it with `bench overhead --proxy-bin`; `image`
    /// packages it (unless `--no-pgo`).
    Pgo(pgo::Pgo),
    /// Replay a request trace through the real router in simulated time (builds the release
    /// binary, then runs `flexinfer-proxy replay` with these arguments).
    Replay(replay::Replay),
}

/// Errors end with status 1 and their causes, never a backtrace (many shells and CI images set
/// `RUST_BACKTRACE=1`, and anyhow would print one): the reason is what the reader needs.
fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.task {
        Task::BuildEbpf(_) => ebpf::build(),
        Task::Setup(args) => setup::run(&args),
        Task::Bench(args) => bench::run(&args),
        Task::Test(args) => test::run(&args),
        Task::Image(args) => image::run(&args),
        Task::Fuzz(args) => fuzz::run(&args),
        Task::Soak(args) => soak::run(&args),
        Task::Replay(args) => replay::run(&args),
        Task::Pgo(args) => pgo::run(&args).map(drop),
    }
}
