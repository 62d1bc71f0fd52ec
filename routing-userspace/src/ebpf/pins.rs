//! The pinned set: maps and the cgroup link under one bpffs directory, shared by every proxy
//! process on the node and surviving restarts.
//!
//! Layout of `<pin_dir>/<LAYOUT>/` (`/sys/fs/bpf/flexinfer/v2/` by default): one file per map
//! (named as in `routing_common::maps`) and the sock_ops cgroup link (`sockops_link`). The link
//! pin is written last, so "the link pin exists" means "the set is complete and attached";
//! creation and removal hold an exclusive flock on `<pin_dir>`.
//!
//! The layout directory is versioned. Pins an earlier build left at the top of `<pin_dir>`
//! (the connection-count layout, and the sk_msg redirect before it) are detached and removed
//! before a set is created: only one sock_ops program can be attached to a cgroup, and maps of
//! another shape must never be read as this one.

use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use aya::maps::{Array, HashMap, Map, MapData};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{CgroupAttachMode, SockOps};
use aya::EbpfLoader;
use routing_common::{maps, programs, BackendKey, ConnSlot, PodConns, LAYOUT, MAX_PODS};

use super::sys::{self, DirLock};
use super::{io_err, EbpfError, EbpfOptions};

/// File name of the pinned sock_ops cgroup link.
pub const LINK_PIN: &str = "sockops_link";
/// Pins earlier builds wrote at the top of the pin directory: the connection-count layout
/// (its maps and link) and the sk_msg same-node redirect before it (its program, SOCKS
/// sockhash and CONFIG switch). Nothing opens them any more; `detach` and a fresh create
/// remove them, so an upgraded node ends up clean.
pub const LEGACY_PINS: [&str; 7] = [
    LINK_PIN,
    maps::LEGACY_LOAD,
    maps::BACKENDS,
    maps::CONNS,
    "skmsg_prog",
    "SOCKS",
    "CONFIG",
];

/// Where the pins of this build's layout live under `pin_dir`.
pub fn set_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join(LAYOUT)
}

/// Open handles on a pinned set.
pub struct PinnedSet {
    /// The layout directory (`<pin_dir>/<LAYOUT>`).
    pub pin_dir: PathBuf,
    /// Whether this call created (and attached) the set, rather than reopening it.
    pub created: bool,
    pub backends: Map,
    pub pods: Map,
    pub conns: Map,
}

fn box_err<E: std::error::Error + Send + Sync + 'static>(
    e: E,
) -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(e)
}

/// The `MapData` inside the map kinds the set uses.
pub fn map_data(m: &Map) -> &MapData {
    match m {
        Map::HashMap(d) | Map::Array(d) => d,
        _ => unreachable!("the pinned set holds only hash and array maps"),
    }
}

/// Make sure `opts.bpffs` is a bpffs (mounting the default one if needed) and that the pin
/// directory exists on it.
pub fn prepare_dirs(opts: &EbpfOptions) -> Result<(), EbpfError> {
    let bpffs = &opts.bpffs;
    let mounted = sys::is_bpffs(bpffs).map_err(io_err("checking", bpffs))?;
    if !mounted {
        if bpffs != Path::new(super::DEFAULT_BPFFS) {
            return Err(EbpfError::NoBpffs {
                path: bpffs.clone(),
            });
        }
        sys::mount_bpffs_once(bpffs).map_err(|source| {
            EbpfError::classify("mounting bpffs", source, |source| EbpfError::MountBpffs {
                path: bpffs.clone(),
                source,
            })
        })?;
    }
    // Only root reads or writes the maps: the pin directories are 0700 (the kernel pins the
    // objects themselves 0600), whatever the umask or an earlier version left.
    let dir = set_dir(&opts.pin_dir);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| {
            EbpfError::classify("creating the pin directory", e, io_err("creating", &dir))
        })?;
    for d in [&opts.pin_dir, &dir] {
        if d == bpffs {
            continue; // the mount's own mode is the node's business
        }
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err("restricting", d))?;
    }
    if !sys::is_bpffs(&opts.pin_dir).map_err(io_err("checking", &opts.pin_dir))? {
        return Err(EbpfError::NoBpffs {
            path: opts.pin_dir.clone(),
        });
    }
    Ok(())
}

impl PinnedSet {
    /// Open the node's pinned set, creating and attaching it if it is not there yet (after
    /// removing the pins of an earlier layout).
    pub fn open_or_create(opts: &EbpfOptions) -> Result<Self, EbpfError> {
        let object = super::embedded_object().ok_or(EbpfError::NotEmbedded)?;
        Self::open_or_create_with(object, opts)
    }

    /// [`PinnedSet::open_or_create`] with a given object instead of the embedded one (the
    /// tests load the object `cargo xtask build-ebpf` wrote, and deliberately broken ones).
    pub fn open_or_create_with(object: &[u8], opts: &EbpfOptions) -> Result<Self, EbpfError> {
        prepare_dirs(opts)?;
        let base = &opts.pin_dir;
        let dir = set_dir(base);
        let _lock = DirLock::exclusive(base).map_err(io_err("locking", base))?;
        let set = if dir.join(LINK_PIN).exists() {
            Self::open_pins(&dir)
        } else {
            let legacy =
                remove_files(base, &LEGACY_PINS).map_err(io_err("removing old pins in", base))?;
            if !legacy.is_empty() {
                tracing::warn!(pin_dir = %base.display(), removed = ?legacy, "detached and removed the pins of an earlier layout");
            }
            Self::create(object, opts)
        };
        drop(_lock);
        set.inspect_err(|_| {
            // Do not leave empty pin directories behind (only succeeds if they are empty).
            let _ = std::fs::remove_dir(&dir);
            let _ = std::fs::remove_dir(base);
        })
    }

    /// Open the existing, complete pinned set under `pin_dir` (used by `status` and by other
    /// processes).
    pub fn open_existing(pin_dir: &Path) -> Result<Self, EbpfError> {
        let dir = set_dir(pin_dir);
        if !dir.join(LINK_PIN).exists() {
            if !dir.exists() && !pin_dir.join(maps::LEGACY_LOAD).exists() {
                return Err(EbpfError::NothingPinned {
                    pin_dir: pin_dir.to_path_buf(),
                });
            }
            let what = if pin_dir.join(maps::LEGACY_LOAD).exists() {
                format!("no {LAYOUT}/{LINK_PIN}, but the pins of an earlier layout: a proxy of this version replaces them when it starts")
            } else {
                format!("no {LAYOUT}/{LINK_PIN}: nothing is attached")
            };
            return Err(EbpfError::BadPins {
                pin_dir: pin_dir.to_path_buf(),
                what,
            });
        }
        Self::open_pins(&dir)
    }

    fn open_pins(pin_dir: &Path) -> Result<Self, EbpfError> {
        // Holding the link open proves it is still a live link, not a stale file.
        PinnedLink::from_pin(pin_dir.join(LINK_PIN)).map_err(|e| {
            EbpfError::classify("opening the pinned link", e, |e| EbpfError::BadPins {
                pin_dir: pin_dir.to_path_buf(),
                what: format!("{LINK_PIN}: {e}"),
            })
        })?;
        let open = |name: &'static str| -> Result<Map, EbpfError> {
            let data = MapData::from_pin(pin_dir.join(name)).map_err(|e| {
                EbpfError::classify("opening a pinned map", e, |e| EbpfError::BadPins {
                    pin_dir: pin_dir.to_path_buf(),
                    what: format!("{name}: {e}"),
                })
            })?;
            Map::from_map_data(data).map_err(|e| EbpfError::Map {
                map: name,
                source: box_err(e),
            })
        };
        let set = Self {
            pin_dir: pin_dir.to_path_buf(),
            created: false,
            backends: open(maps::BACKENDS)?,
            pods: open(maps::PODS)?,
            conns: open(maps::CONNS)?,
        };
        set.check_shapes()?;
        Ok(set)
    }

    /// Pins from another build of the object could disagree on sizes; refuse them loudly.
    fn check_shapes(&self) -> Result<(), EbpfError> {
        let bad = |what: String| EbpfError::BadPins {
            pin_dir: self.pin_dir.clone(),
            what,
        };
        let pods = map_data(&self.pods)
            .info()
            .map_err(|e| bad(format!("PODS info: {e}")))?;
        let want = std::mem::size_of::<PodConns>() as u32;
        if pods.max_entries() != MAX_PODS || pods.value_size() != want {
            return Err(bad(format!(
                "PODS has {} entries of {} bytes, expected {MAX_PODS} of {want}",
                pods.max_entries(),
                pods.value_size()
            )));
        }
        if pods.map_flags() & routing_common::BPF_F_MMAPABLE as u32 == 0 {
            return Err(bad("PODS is not mmapable".into()));
        }
        let conns = map_data(&self.conns)
            .info()
            .map_err(|e| bad(format!("CONNS info: {e}")))?;
        if conns.key_size() != 8 || conns.value_size() as usize != std::mem::size_of::<ConnSlot>() {
            return Err(bad(format!(
                "CONNS key/value sizes {}/{} do not match this build",
                conns.key_size(),
                conns.value_size()
            )));
        }
        let b = map_data(&self.backends)
            .info()
            .map_err(|e| bad(format!("BACKENDS info: {e}")))?;
        if b.key_size() as usize != std::mem::size_of::<BackendKey>() || b.value_size() != 4 {
            return Err(bad(format!(
                "BACKENDS key/value sizes {}/{} do not match this build",
                b.key_size(),
                b.value_size()
            )));
        }
        Ok(())
    }

    fn create(object: &[u8], opts: &EbpfOptions) -> Result<Self, EbpfError> {
        let pin_dir = &set_dir(&opts.pin_dir);
        let cgroup_path = match &opts.cgroup {
            Some(p) => p.clone(),
            None => super::cgroup::cgroup2_root()?,
        };
        let cgroup = File::open(&cgroup_path).map_err(io_err("opening cgroup", &cgroup_path))?;
        if !sys::is_cgroup2(&cgroup_path).map_err(io_err("checking", &cgroup_path))? {
            return Err(EbpfError::NotCgroup2 { path: cgroup_path });
        }
        // Without the link pin nothing is attached, so map pins left here (a crash between
        // pinning maps and pinning the link) hold counts no program will ever count down.
        // Start from fresh maps rather than reuse them.
        remove_files(pin_dir, &SET_PINS).map_err(io_err("removing stale pins in", pin_dir))?;
        let result = (|| {
            let pins: Vec<(&str, PathBuf)> =
                maps::ALL.iter().map(|n| (*n, pin_dir.join(n))).collect();
            let mut loader = EbpfLoader::new();
            for (name, path) in &pins {
                loader.map_pin_path(name, path.as_path());
            }
            let btf = Path::new(super::KERNEL_BTF);
            let mut bpf = loader
                .load(object)
                .map_err(|e| super::classify_load("loading the object", e, btf))?;

            let sockops: &mut SockOps = bpf
                .program_mut(programs::SOCK_OPS)
                .ok_or_else(|| {
                    EbpfError::Load(format!("no program {}", programs::SOCK_OPS).into())
                })?
                .try_into()
                .map_err(|e| EbpfError::Load(box_err(e)))?;
            sockops.load().map_err(|e| {
                super::classify_program_load("loading sock_ops", programs::SOCK_OPS, e, btf)
            })?;
            let attach_err = |e: Box<dyn std::error::Error + Send + Sync>| EbpfError::Attach {
                cgroup: cgroup_path.clone(),
                source: e,
            };
            let id = sockops
                .attach(&cgroup, CgroupAttachMode::Single)
                .map_err(|e| {
                    EbpfError::classify("attaching sock_ops", e, |e| attach_err(box_err(e)))
                })?;
            let link = sockops.take_link(id).map_err(|e| attach_err(box_err(e)))?;
            let link = FdLink::try_from(link).map_err(|e| attach_err(box_err(e)))?;
            link.pin(pin_dir.join(LINK_PIN))
                .map_err(|e| attach_err(box_err(e)))?;

            let mut take = |name: &'static str| {
                bpf.take_map(name)
                    .ok_or_else(|| EbpfError::Load(format!("no map {name}").into()))
            };
            Ok(Self {
                pin_dir: pin_dir.clone(),
                created: true,
                backends: take(maps::BACKENDS)?,
                pods: take(maps::PODS)?,
                conns: take(maps::CONNS)?,
            })
        })();
        if result.is_err() {
            // Leave nothing half-made behind: the next open must start clean.
            let _ = remove_files(pin_dir, &SET_PINS);
        }
        result
    }

    /// BACKENDS as a typed map.
    pub fn backends(&mut self) -> Result<HashMap<&mut MapData, BackendKey, u32>, EbpfError> {
        HashMap::try_from(&mut self.backends).map_err(|e| EbpfError::Map {
            map: maps::BACKENDS,
            source: box_err(e),
        })
    }

    /// Entries of BACKENDS (one syscall per entry; for rebuilds and `status`, not the hot path).
    pub fn backend_entries(&self) -> Result<Vec<(BackendKey, u32)>, EbpfError> {
        let m: HashMap<&MapData, BackendKey, u32> =
            HashMap::try_from(&self.backends).map_err(|e| EbpfError::Map {
                map: maps::BACKENDS,
                source: box_err(e),
            })?;
        m.iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| EbpfError::Map {
                map: maps::BACKENDS,
                source: box_err(e),
            })
    }

    /// `PODS[slot]` through a map-lookup syscall (for `status`, not the hot path).
    pub fn pod_lookup(&self, slot: u32) -> Result<PodConns, EbpfError> {
        let m: Array<&MapData, PodConns> =
            Array::try_from(&self.pods).map_err(|e| EbpfError::Map {
                map: maps::PODS,
                source: box_err(e),
            })?;
        m.get(&slot, 0).map_err(|e| EbpfError::Map {
            map: maps::PODS,
            source: box_err(e),
        })
    }

    /// Where the kernel counts the connection with socket `cookie` (one syscall; done once per
    /// new connection).
    pub fn conn_slot(&self, cookie: u64) -> Result<Option<ConnSlot>, EbpfError> {
        let m: HashMap<&MapData, u64, ConnSlot> =
            HashMap::try_from(&self.conns).map_err(|e| EbpfError::Map {
                map: maps::CONNS,
                source: box_err(e),
            })?;
        match m.get(&cookie, 0) {
            Ok(s) => Ok(Some(s)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(EbpfError::Map {
                map: maps::CONNS,
                source: box_err(e),
            }),
        }
    }

    /// Number of connections the kernel is currently tracking (CONNS entries).
    pub fn tracked_connections(&self) -> Result<usize, EbpfError> {
        let m: HashMap<&MapData, u64, ConnSlot> =
            HashMap::try_from(&self.conns).map_err(|e| EbpfError::Map {
                map: maps::CONNS,
                source: box_err(e),
            })?;
        Ok(m.keys().filter(|k| k.is_ok()).count())
    }
}

/// What [`remove_pins`] removed.
#[derive(Debug, Default)]
pub struct Removed {
    pub files: Vec<PathBuf>,
    pub dir_removed: bool,
}

/// Detach and unpin everything under `pin_dir` that this build or an earlier one pins, then
/// remove the directories if they are empty. Unpinning the link drops the last reference to
/// the cgroup attachment (proxies do not keep the link open), which detaches sock_ops; the
/// maps go when their last user (a running proxy's mmap/fds) closes.
pub fn remove_pins(pin_dir: &Path) -> io::Result<Removed> {
    let mut removed = Removed::default();
    if !pin_dir.exists() {
        return Ok(removed);
    }
    let lock = DirLock::exclusive(pin_dir)?;
    let dir = set_dir(pin_dir);
    if dir.exists() {
        removed.files = remove_files(&dir, &SET_PINS)?;
        let _ = std::fs::remove_dir(&dir);
    }
    removed.files.extend(remove_files(pin_dir, &LEGACY_PINS)?);
    drop(lock);
    removed.dir_removed = std::fs::remove_dir(pin_dir).is_ok();
    Ok(removed)
}

/// The pins of a set: the link first, so the set stops counting before its maps go.
const SET_PINS: [&str; 4] = [LINK_PIN, maps::BACKENDS, maps::PODS, maps::CONNS];

/// Remove the files `names` in `dir` that exist, in that order. The caller holds the lock.
fn remove_files(dir: &Path, names: &[&str]) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for name in names {
        let p = dir.join(name);
        match std::fs::remove_file(&p) {
            Ok(()) => files.push(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(files)
}
