//! Where things are: the workspace root, the cargo target directory, chart and crate versions.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}

/// The cargo target directory, honouring `CARGO_TARGET_DIR`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => {
            let d = PathBuf::from(d);
            if d.is_absolute() {
                d
            } else {
                workspace_root().join(d)
            }
        }
        None => workspace_root().join("target"),
    }
}

/// Make `dir` an empty directory: what it held is removed, and it is created if missing.
pub fn fresh_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("clearing {}", dir.display()))
        }
        _ => {}
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// The value of a top-level `key: value` line of a YAML file (quotes removed).
fn yaml_scalar(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix(key)?.strip_prefix(':')?;
        let v = v.split(" #").next().unwrap_or(v).trim();
        Some(v.trim_matches('"').trim_matches('\'').to_owned())
    })
}

/// The chart's `appVersion`: the image tag the chart deploys by default.
pub fn chart_app_version() -> Result<String> {
    let path = workspace_root().join("charts/flexinfer-proxy/Chart.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    match yaml_scalar(&text, "appVersion") {
        Some(v) if !v.is_empty() => Ok(v),
        _ => bail!("{} has no appVersion", path.display()),
    }
}

/// `[workspace.package] version` of the root Cargo.toml: what `flexinfer-proxy --version` says.
pub fn crate_version() -> Result<String> {
    let path = workspace_root().join("Cargo.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let section = text
        .split("\n[")
        .find(|s| s.starts_with("workspace.package]"))
        .with_context(|| format!("{} has no [workspace.package]", path.display()))?;
    section
        .lines()
        .find_map(|l| {
            let v = l.trim().strip_prefix("version")?.trim().strip_prefix('=')?;
            Some(v.trim().trim_matches('"').to_owned())
        })
        .with_context(|| format!("{} has no workspace version", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_deploys_the_version_the_binary_reports() {
        assert_eq!(chart_app_version().unwrap(), crate_version().unwrap());
    }

    #[test]
    fn yaml_scalars() {
        let t = "name: x\nappVersion: \"0.1.0\" # the image tag\nversion: 1\n";
        assert_eq!(yaml_scalar(t, "appVersion").as_deref(), Some("0.1.0"));
        assert_eq!(yaml_scalar(t, "version").as_deref(), Some("1"));
        assert_eq!(yaml_scalar(t, "kubeVersion"), None);
    }
}
