//! `cargo xtask replay ...`: build the release `flexinfer-proxy` and run its `replay`
//! subcommand with the same arguments. The simulator lives in routing-userspace (it runs the
//! proxy's real router), so xtask stays free of that dependency and quick to build.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use xtask::paths::{target_dir, workspace_root};

#[derive(clap::Args)]
pub(crate) struct Replay {
    /// Print docs/routing-quality.md's fleet tables, stamped with the commit: the Mooncake
    /// conversation trace (../shared/data/mooncake) and a generated rag-chat trace, the first
    /// 1,500 requests of each, 32 in flight, through 1, 4 and 8 routers, over 4 pods and then
    /// over 8.
    #[arg(long)]
    pub fleets: bool,

    /// Arguments of `flexinfer-proxy replay` (see `flexinfer-proxy replay --help`), e.g.
    /// `--trace FILE --pods 4 --strategy cache-aware,prefix-bounded`, or
    /// `--generate rag-chat --out FILE`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

pub(crate) fn run(args: &Replay) -> Result<()> {
    let bin = crate::ebpf::release_proxy(true, false)?;
    if args.fleets {
        return fleets(&bin);
    }
    replay(&bin, &args.args)
}

fn replay<S: AsRef<std::ffi::OsStr>>(bin: &Path, args: &[S]) -> Result<()> {
    let status = Command::new(bin)
        .arg("replay")
        .args(args)
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    if !status.success() {
        bail!("flexinfer-proxy replay failed ({status})");
    }
    Ok(())
}

/// The fleet tables of docs/routing-quality.md.
fn fleets(bin: &Path) -> Result<()> {
    let root = workspace_root();
    let conversation = root.join("../shared/data/mooncake/conversation_trace.jsonl");
    if !conversation.is_file() {
        bail!(
            "{} is missing: the Mooncake trace comes with ../shared beside the checkout",
            conversation.display()
        );
    }
    let dir = target_dir().join("replay");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let rag_chat = dir.join("rag-chat.jsonl");
    let rag_path = rag_chat.to_string_lossy().into_owned();
    replay(bin, &["--generate", "rag-chat", "--out", rag_path.as_str()])?;
    let commit = Command::new("git")
        .current_dir(&root)
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    println!("commit {commit}\n");
    for pods in ["4", "8"] {
        for trace in [&conversation, &rag_chat] {
            let trace = trace.to_string_lossy().into_owned();
            let fixed = [
                "--pods",
                pods,
                "--requests",
                "1500",
                "--in-flight",
                "32",
                "--routers",
                "1,4,8",
            ];
            let mut args = vec!["--trace", trace.as_str()];
            args.extend(fixed);
            replay(bin, &args)?;
            println!();
        }
    }
    Ok(())
}
