//! The eBPF data plane: a node-wide, crash-safe count of established connections per pod.
//!
//! `flexinfer_sockops` (sock_ops, attached to a cgroup2) sees every TCP socket of the
//! processes in that cgroup. When an outgoing connection to a pod listed in BACKENDS becomes
//! established it bumps `LOAD[slot]` and remembers the socket (cookie -> slot in CONNS); when
//! that socket leaves ESTABLISHED (close, reset, or its process dying) it counts it down. Only
//! remembered sockets are counted down, so sockets opened before attach, or to pods added
//! later, never drive a slot below what was counted.
//!
//! Entry points are thin; the logic is in `try_*` functions. On the host this crate builds as
//! an empty binary so `cargo clippy --workspace` stays green.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
mod prog {
    use core::intrinsics::{atomic_xadd, AtomicOrdering};

    use aya_ebpf::{
        bindings::BPF_NOEXIST,
        btf_maps::{Array, HashMap},
        helpers::generated::bpf_get_socket_cookie,
        macros::{btf_map, sock_ops},
        programs::SockOpsContext,
        EbpfContext,
    };
    use routing_common::{
        remote_port_to_host, BackendKey, BPF_F_MMAPABLE, FAMILY_V4, FAMILY_V6, MAX_PODS,
        MAX_TRACKED_CONNS,
    };

    // Kernel constants (uapi/linux/bpf.h), fixed ABI.
    const BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB: u32 = 4;
    const BPF_SOCK_OPS_STATE_CB: u32 = 10;
    const BPF_SOCK_OPS_STATE_CB_FLAG: u32 = 1 << 2;
    const BPF_TCP_ESTABLISHED: u32 = 1;

    #[btf_map]
    static BACKENDS: HashMap<BackendKey, u32, { MAX_PODS as usize }> = HashMap::new();

    #[btf_map]
    static LOAD: Array<u64, { MAX_PODS as usize }, BPF_F_MMAPABLE> = Array::new();

    #[btf_map]
    static CONNS: HashMap<u64, u32, { MAX_TRACKED_CONNS as usize }> = HashMap::new();

    #[sock_ops]
    pub fn flexinfer_sockops(ctx: SockOpsContext) -> u32 {
        try_sockops(&ctx);
        // sock_ops return values are ignored except for a few ops we do not handle.
        1
    }

    /// Add `delta` (wrapping; `u64::MAX` is -1) to `LOAD[slot]` atomically.
    #[inline(always)]
    fn load_add(slot: u32, delta: u64) {
        if let Some(p) = LOAD.get_ptr_mut(slot) {
            // SAFETY: `p` points into the array map's value for `slot`, valid for this program
            // run; the xadd is atomic against other CPUs and userspace readers. The return
            // value is unused, which lets LLVM emit a plain BPF atomic add.
            unsafe {
                atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, delta);
            }
        }
    }

    fn remote_key(ctx: &SockOpsContext) -> Option<BackendKey> {
        let port = remote_port_to_host(ctx.remote_port());
        match ctx.family() {
            FAMILY_V4 => Some(BackendKey::v4(ctx.remote_ip4(), port)),
            FAMILY_V6 => Some(BackendKey::v6(ctx.remote_ip6(), port)),
            _ => None,
        }
    }

    fn try_sockops(ctx: &SockOpsContext) {
        match ctx.op() {
            BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB => on_active_established(ctx),
            BPF_SOCK_OPS_STATE_CB => on_state_change(ctx),
            _ => {}
        }
    }

    fn on_active_established(ctx: &SockOpsContext) {
        let Some(key) = remote_key(ctx) else { return };
        // SAFETY: the value is copied out at once; userspace writes only whole entries.
        let Some(slot) = (unsafe { BACKENDS.get(key) }).copied() else {
            return;
        };
        // SAFETY: `ctx.as_ptr()` is this program's `bpf_sock_ops`, which the cookie helper accepts.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        // Count only what we can later count down: remember the socket first.
        if CONNS.insert(cookie, slot, BPF_NOEXIST as u64).is_err() {
            return;
        }
        if ctx
            .set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32)
            .is_err()
        {
            let _ = CONNS.remove(cookie);
            return;
        }
        load_add(slot, 1);
    }

    fn on_state_change(ctx: &SockOpsContext) {
        // arg(1) is the new state. Leaving ESTABLISHED (FIN sent or received, reset, close)
        // ends the request for the gauge; later transitions find no entry and do nothing.
        if ctx.arg(1) == BPF_TCP_ESTABLISHED {
            return;
        }
        // SAFETY: see `on_active_established`.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        // SAFETY: the value is copied out before the entry is removed.
        let Some(slot) = (unsafe { CONNS.get(cookie) }).copied() else {
            return;
        };
        // Whoever removes the entry counts down, so a racing second callback cannot.
        if CONNS.remove(cookie).is_ok() {
            load_add(slot, u64::MAX);
        }
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 4] = *b"GPL\0";
}
