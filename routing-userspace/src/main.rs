//! The `flexinfer-proxy` binary.

use clap::{Parser, Subcommand};

// The system allocator, not mimalloc: an open stream holds a few long-lived buffers of mixed
// sizes, and with 1,000 streams mimalloc's size-class pages kept 30.4 KiB resident per stream
// against 20.2 with glibc's malloc, for 4% fewer instructions per short request (54.5k against
// 56.8k under callgrind) and no gain in requests per second (docs/benchmarks.md, "Streams").

use routing_userspace::config::{EbpfArgs, ServeArgs};
use routing_userspace::demo::DemoArgs;
use routing_userspace::replay::ReplayArgs;
use routing_userspace::sim::SimArgs;

#[derive(Parser)]
#[command(
    name = "flexinfer-proxy",
    version,
    about = "An L7 request router for OpenAI-compatible model servers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Serve(Box<ServeArgs>),
    /// Run a simulated OpenAI-compatible model server (one GPU replica stand-in).
    Sim(SimArgs),
    /// Run the Chat-with-Doc demo: simulated replicas, a proxy, default vs prefix vs cache-aware
    /// routing, the spec's three phases and a hot-prompt phase.
    Demo(DemoArgs),
    /// Replay a request trace (Mooncake format) through the real router against a simulated
    /// fleet, in simulated time; print block hit ratio, load spread and TTFT per strategy.
    Replay(Box<ReplayArgs>),
    /// Inspect or remove the pinned eBPF data plane.
    Ebpf {
        #[command(subcommand)]
        action: EbpfAction,
    },
    /// Check configuration before a proxy loads it.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Validate a models file (exit status 1 and LINE:COLUMN on error) and print each model's
    /// routing as the proxy will run it.
    Check(Box<routing_userspace::discovery::check::CheckArgs>),
}

#[derive(Subcommand)]
enum EbpfAction {
    /// Per pod: its slot and live connection count, read from the pinned maps.
    Status(EbpfArgs),
    /// Detach the programs and remove everything pinned under --bpf-pin-dir.
    Detach(EbpfArgs),
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

/// The tokio runtime: one worker thread per core, or as many as asked. With one, the
/// current-thread scheduler runs everything on this thread (no cross-thread wake-ups).
fn runtime(worker_threads: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut b = match worker_threads.filter(|&n| n > 0) {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    b.enable_all();
    Ok(b.build()?)
}

/// Errors end the process with status 1 and their chain of causes on stderr, never a
/// backtrace: what an operator reads in `kubectl logs` is the reason, not our stack (a shell
/// with `RUST_BACKTRACE=1` would otherwise get one from anyhow).
fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let mut last = e.to_string();
            eprintln!("Error: {last}");
            // Our errors mostly quote their source already; a cause is shown only when new.
            for cause in e.chain().skip(1).map(|c| c.to_string()) {
                if !last.contains(&cause) {
                    eprintln!("  caused by: {cause}");
                }
                last = cause;
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    init_logging();
    match cli.command {
        Command::Serve(args) => {
            let rt = runtime(args.worker_threads)?;
            Ok(rt.block_on(routing_userspace::app::serve(
                *args,
                routing_userspace::app::shutdown_signal(),
            ))?)
        }
        Command::Sim(args) => runtime(None)?.block_on(routing_userspace::sim::run(args)),
        Command::Demo(args) => runtime(None)?.block_on(routing_userspace::demo::run(args)),
        Command::Replay(args) => routing_userspace::replay::run(&args),
        Command::Ebpf { action } => match action {
            EbpfAction::Status(args) => routing_userspace::ebpf::cli::status(&args.options()),
            EbpfAction::Detach(args) => routing_userspace::ebpf::cli::detach(&args.options()),
        },
        Command::Config {
            action: ConfigAction::Check(args),
        } => {
            if !routing_userspace::discovery::check::run(&args)? {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}
