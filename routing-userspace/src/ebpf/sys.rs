//! The few raw Linux calls aya does not wrap: statfs (is this bpffs?), mount, flock, mmap of
//! a BPF array, a socket's cookie and BPF_PROG_QUERY. All unsafe code of the loader lives
//! here.
#![allow(unsafe_code)] // see the SAFETY lines

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

/// `BPF_FS_MAGIC` from linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// `CGROUP2_SUPER_MAGIC` from linux/magic.h.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// `BPF_CGROUP_SOCK_OPS` attach type.
const BPF_CGROUP_SOCK_OPS: u32 = 3;
/// `BPF_PROG_QUERY` command.
const BPF_PROG_QUERY: libc::c_long = 16;

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// The filesystem magic of the filesystem `path` is on (`statfs`'s `f_type`).
fn fs_magic(path: &Path) -> io::Result<i64> {
    let c = cpath(path)?;
    // SAFETY: statfs writes only into `buf`, a properly sized, owned struct; `c` is a valid
    // NUL-terminated path.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::statfs(c.as_ptr(), &mut buf) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(buf.f_type as i64)
}

/// Whether `path` is on a bpf filesystem.
pub fn is_bpffs(path: &Path) -> io::Result<bool> {
    Ok(fs_magic(path)? == BPF_FS_MAGIC)
}

/// Whether `path` is on the cgroup v2 (unified) hierarchy.
pub fn is_cgroup2(path: &Path) -> io::Result<bool> {
    Ok(fs_magic(path)? == CGROUP2_SUPER_MAGIC)
}

/// Mount bpffs at `path` unless it is one already; returns whether this call mounted it.
///
/// Proxies (and test processes) starting at the same moment on a node without bpffs would
/// each see no bpffs and each mount one, stacking mounts. So the check and the mount happen
/// under an exclusive flock of the mount point directory, and the check is made again once the
/// lock is held: exactly one caller mounts. (A caller that opens the directory after the mount
/// locks the new bpffs root instead, but its check before locking already saw the bpffs.)
pub fn mount_bpffs_once(path: &Path) -> io::Result<bool> {
    if is_bpffs(path)? {
        return Ok(false);
    }
    let _lock = DirLock::exclusive(path)?;
    if is_bpffs(path)? {
        return Ok(false);
    }
    mount_bpffs(path)?;
    Ok(true)
}

/// `mount -t bpf bpf <path>`.
fn mount_bpffs(path: &Path) -> io::Result<()> {
    let target = cpath(path)?;
    let src = c"bpf";
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call; no
    // mount data is passed.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            src.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An exclusive `flock` on a directory, released on drop. Serialises "are the pins there?
/// then create them" between proxy processes starting at the same time.
pub struct DirLock(File);

impl DirLock {
    pub fn exclusive(dir: &Path) -> io::Result<Self> {
        let f = File::open(dir)?;
        // SAFETY: flock on a descriptor we own; no memory is passed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self(f))
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // SAFETY: as above; closing the file would release the lock anyway.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// A shared, writable mapping of a `BPF_F_MMAPABLE` array, viewed as `u64` atomics (the
/// kernel program and every proxy on the node update the same words).
pub struct MappedWords {
    ptr: NonNull<AtomicU64>,
    len: usize,
    bytes: usize,
}

// SAFETY: the mapping is plain shared memory accessed only through atomics; it is unmapped
// once, in Drop, when no reference can remain.
unsafe impl Send for MappedWords {}
// SAFETY: as above.
unsafe impl Sync for MappedWords {}

impl MappedWords {
    /// Map `len` u64 words of the array map behind `fd`, read-write.
    pub fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<Self> {
        let bytes = (len * 8).next_multiple_of(page_size());
        // SAFETY: a fresh shared mapping of a BPF array fd; the kernel validates the size
        // against the map (mmapable arrays are page-aligned) and fails cleanly if not.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<AtomicU64>())
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len, bytes })
    }

    /// All words. The kernel and other processes update them concurrently: use atomics only.
    #[inline]
    pub fn as_slice(&self) -> &[AtomicU64] {
        // SAFETY: the mapping holds at least `len` page-aligned (so 8-aligned) u64 values and
        // lives as long as `self`; AtomicU64 has the layout of u64 and tolerates concurrent
        // writers (the kernel's atomic adds).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for MappedWords {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the region mapped in `map`; no borrow outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.bytes) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory side effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// The socket cookie of `fd` (`SO_COOKIE`): how BPF programs name a socket.
pub fn socket_cookie(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cookie`, a u64 we own, and updates
    // `len`; `fd` is a socket borrowed for the duration of the call.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// The kernel's `bpf_attr` for BPF_PROG_QUERY.
#[repr(C)]
#[derive(Default)]
struct ProgQueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// IDs of the sock_ops programs attached directly to the cgroup open at `cgroup`.
pub fn sock_ops_attached(cgroup: &File) -> io::Result<Vec<u32>> {
    let mut ids = [0u32; 64];
    let mut attr = ProgQueryAttr {
        target_fd: cgroup.as_fd().as_raw_fd() as u32,
        attach_type: BPF_CGROUP_SOCK_OPS,
        prog_ids: ids.as_mut_ptr() as u64,
        prog_cnt: ids.len() as u32,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid BPF_PROG_QUERY attribute of the size passed; the kernel writes
    // at most `prog_cnt` ids into `ids`, which outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_QUERY,
            &mut attr as *mut ProgQueryAttr,
            std::mem::size_of::<ProgQueryAttr>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let n = (attr.prog_cnt as usize).min(ids.len());
    Ok(ids[..n].to_vec())
}

/// The effective user id (for error messages).
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}
