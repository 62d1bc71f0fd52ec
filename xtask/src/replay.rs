//! `cargo xtask replay ...`: build the release `flexinfer-proxy` and run its `replay`
//! subcommand with the same arguments. The simulator lives in routing-userspace (it runs the
//! proxy's real router), so xtask stays free of that dependency and quick to build.

use std::process::Command;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct Replay {
    /// Arguments of `flexinfer-proxy replay` (see `flexinfer-proxy replay --help`), e.g.
    /// `--trace FILE --pods 4 --strategy cache-aware,prefix-bounded`, or
    /// `--generate rag-chat --out FILE`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

pub fn run(args: &Replay) -> Result<()> {
    let bin = crate::ebpf::release_proxy(true, false)?;
    let status = Command::new(&bin)
        .arg("replay")
        .args(&args.args)
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    if !status.success() {
        bail!("flexinfer-proxy replay failed ({status})");
    }
    Ok(())
}
