//! The aya loader for the eBPF data plane: load, pin, attach, and reopen across restarts.
//!
//! One pinned set per node (default `/sys/fs/bpf/flexinfer/`) holds the maps and the cgroup
//! link. The first proxy to start creates and attaches it; every later or concurrent proxy
//! (and a restarted one) opens the pins instead, so a connection is counted once no matter
//! how many proxies run. `cli::detach` removes the set. The object itself is embedded at build
//! time by `build.rs`; an empty embedding means "built without eBPF" and `open` says so.

pub mod cgroup;
pub mod cli;
pub mod pins;
pub mod sys;

use std::io;
use std::path::{Path, PathBuf};

pub use crate::load::ebpf::EbpfGauge;
pub use pins::PinnedSet;

/// The embedded eBPF object (empty when the binary was built without one).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/routing-ebpf.o"));

/// The eBPF object built into this binary, or `None` if it was built without one
/// (`cargo xtask build-ebpf` before `cargo build`, or `FLEXINFER_EBPF_OBJECT`, embeds it).
pub fn embedded_object() -> Option<&'static [u8]> {
    (!OBJECT.is_empty()).then_some(OBJECT)
}

/// The conventional bpffs mount point, the only one `open` mounts by itself.
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf";
/// Default directory of the pinned set.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/flexinfer";

/// Where and how to load the data plane.
#[derive(Clone, Debug)]
pub struct EbpfOptions {
    /// cgroup2 directory to attach sock_ops to; `None` = the cgroup2 root (every process on
    /// the node), found from /proc/self/mounts.
    pub cgroup: Option<PathBuf>,
    /// Directory for the pins (must be on bpffs).
    pub pin_dir: PathBuf,
    /// The bpffs mount. If it is [`DEFAULT_BPFFS`] and not mounted, `open` mounts it; any other
    /// path must already be a bpffs.
    pub bpffs: PathBuf,
}

impl Default for EbpfOptions {
    fn default() -> Self {
        Self {
            cgroup: None,
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            bpffs: PathBuf::from(DEFAULT_BPFFS),
        }
    }
}

/// Why the eBPF gauge could not be opened. Every variant says what to do about it; the proxy
/// logs it once and falls back to the userspace gauge (or exits with `--require-ebpf`).
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("eBPF is not built into this binary (run `cargo xtask build-ebpf --release` before building, or set FLEXINFER_EBPF_OBJECT)")]
    NotEmbedded,
    #[error("{path} is not a bpf filesystem (mount it: `mount -t bpf bpf {path}`)")]
    NoBpffs { path: PathBuf },
    #[error("mounting bpffs at {path} failed: {source}")]
    MountBpffs { path: PathBuf, source: io::Error },
    #[error("permission denied for BPF while {action} (euid {euid}; needs root or CAP_BPF + CAP_NET_ADMIN + CAP_SYS_ADMIN): {source}")]
    PermissionDenied {
        action: &'static str,
        euid: u32,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("no cgroup2 mount found in /proc/self/mounts (pass a cgroup path)")]
    NoCgroup2,
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("loading the eBPF object failed: {0}")]
    Load(Box<dyn std::error::Error + Send + Sync>),
    #[error("attaching sock_ops to cgroup {cgroup} failed: {source}")]
    Attach {
        cgroup: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("nothing pinned at {pin_dir}: no proxy with the eBPF gauge has loaded it on this node, or it was detached (a proxy started with another --bpf-pin-dir pins there)")]
    NothingPinned { pin_dir: PathBuf },
    #[error("pinned set at {pin_dir} is unusable ({what}); remove it with `flexinfer-proxy ebpf detach`")]
    BadPins { pin_dir: PathBuf, what: String },
    #[error("BPF map operation on {map} failed: {source}")]
    Map {
        map: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl EbpfError {
    /// Classify a failed BPF operation: EPERM/EACCES become [`EbpfError::PermissionDenied`].
    pub(crate) fn classify<E>(action: &'static str, err: E, other: impl FnOnce(E) -> Self) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        if is_permission(&err) {
            Self::PermissionDenied {
                action,
                euid: sys::euid(),
                source: Box::new(err),
            }
        } else {
            other(err)
        }
    }
}

/// Whether an error chain bottoms out in EPERM or EACCES.
fn is_permission(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
                return true;
            }
        }
        cur = e.source();
    }
    false
}

pub(crate) fn io_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> EbpfError + 'a {
    move |source| EbpfError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}
