//! The eBPF data plane: a node-wide, crash-safe count of established connections per pod.
//!
//! `flexinfer_sockops` (sock_ops, attached to a cgroup2) sees every TCP socket of the
//! processes in that cgroup. When an outgoing connection to a pod listed in BACKENDS becomes
//! established it bumps `LOAD[slot]` and remembers the socket (cookie -> slot in CONNS); when
//! that socket leaves ESTABLISHED (close, reset, or its process dying) it counts it down. Only
//! remembered sockets are counted down, so sockets opened before attach, or to pods added
//! later, never drive a slot below what was counted.
//!
//! `flexinfer_skmsg` (sk_msg on the SOCKS sockhash) is the opt-in same-node redirect: when
//! CONFIG asks for it, sockets to and from tracked pods are put in SOCKS and a send on one end
//! is spliced straight into the peer socket's receive queue, skipping the loopback TCP stack.
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
        bindings::{sk_action::SK_PASS, BPF_F_INGRESS, BPF_NOEXIST},
        btf_maps::{Array, HashMap, SockHash},
        helpers::generated::bpf_get_socket_cookie,
        macros::{btf_map, sk_msg, sock_ops},
        programs::{SkMsgContext, SockOpsContext},
        EbpfContext,
    };
    use routing_common::{
        remote_port_to_host, BackendKey, Config, SockKey, BPF_F_MMAPABLE, CONFIG_REDIRECT,
        FAMILY_V4, FAMILY_V6, MAX_PODS, MAX_REDIRECT_SOCKS, MAX_TRACKED_CONNS,
    };

    // Kernel constants (uapi/linux/bpf.h), fixed ABI.
    const BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB: u32 = 4;
    const BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB: u32 = 5;
    const BPF_SOCK_OPS_STATE_CB: u32 = 10;
    const BPF_SOCK_OPS_STATE_CB_FLAG: u32 = 1 << 2;
    const BPF_TCP_ESTABLISHED: u32 = 1;

    #[btf_map]
    static BACKENDS: HashMap<BackendKey, u32, { MAX_PODS as usize }> = HashMap::new();

    #[btf_map]
    static LOAD: Array<u64, { MAX_PODS as usize }, BPF_F_MMAPABLE> = Array::new();

    #[btf_map]
    static CONNS: HashMap<u64, u32, { MAX_TRACKED_CONNS as usize }> = HashMap::new();

    #[btf_map]
    static CONFIG: Array<Config, 1> = Array::new();

    #[btf_map]
    static SOCKS: SockHash<SockKey, { MAX_REDIRECT_SOCKS as usize }> = SockHash::new();

    #[sock_ops]
    pub fn flexinfer_sockops(ctx: SockOpsContext) -> u32 {
        try_sockops(&ctx);
        // sock_ops return values are ignored except for a few ops we do not handle.
        1
    }

    #[sk_msg]
    pub fn flexinfer_skmsg(ctx: SkMsgContext) -> u32 {
        try_skmsg(&ctx);
        // Always pass: a redirect that found no peer leaves the message on the normal path.
        SK_PASS
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

    fn local_key(ctx: &SockOpsContext) -> Option<BackendKey> {
        let port = ctx.local_port() as u16;
        match ctx.family() {
            FAMILY_V4 => Some(BackendKey::v4(ctx.local_ip4(), port)),
            FAMILY_V6 => Some(BackendKey::v6(ctx.local_ip6(), port)),
            _ => None,
        }
    }

    fn sock_key(ctx: &SockOpsContext) -> Option<SockKey> {
        let remote = remote_key(ctx)?;
        let local = local_key(ctx)?;
        Some(SockKey {
            family: remote.family,
            local_port: local.port,
            remote_port: remote.port,
            local_addr: local.addr,
            remote_addr: remote.addr,
        })
    }

    fn redirect_enabled() -> bool {
        CONFIG
            .get(0)
            .is_some_and(|c| c.flags & CONFIG_REDIRECT != 0)
    }

    fn try_sockops(ctx: &SockOpsContext) {
        match ctx.op() {
            BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB => on_active_established(ctx),
            BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => on_passive_established(ctx),
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
        if redirect_enabled() {
            if let Some(mut sk) = sock_key(ctx) {
                // SAFETY: `ctx.ops` is this program's live `bpf_sock_ops`.
                let _ = SOCKS.update(&mut sk, unsafe { &mut *ctx.ops }, 0);
            }
        }
    }

    /// The pod side of a same-node connection: only needed for the redirect.
    fn on_passive_established(ctx: &SockOpsContext) {
        if !redirect_enabled() {
            return;
        }
        let Some(local) = local_key(ctx) else { return };
        // SAFETY: only tests for presence.
        if unsafe { BACKENDS.get(local) }.is_none() {
            return;
        }
        if let Some(mut sk) = sock_key(ctx) {
            // SAFETY: `ctx.ops` is this program's live `bpf_sock_ops`.
            let _ = SOCKS.update(&mut sk, unsafe { &mut *ctx.ops }, 0);
        }
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

    fn try_skmsg(ctx: &SkMsgContext) {
        // SAFETY: `ctx.msg` is this program's live `sk_msg_md`; plain field reads.
        let md = unsafe { &*ctx.msg };
        let port = remote_port_to_host(md.remote_port);
        let (family, local, remote) = match md.family {
            FAMILY_V4 => (FAMILY_V4, [md.local_ip4, 0, 0, 0], [md.remote_ip4, 0, 0, 0]),
            FAMILY_V6 => {
                let l = BackendKey::v6(md.local_ip6, 0);
                let r = BackendKey::v6(md.remote_ip6, 0);
                (r.family, l.addr, r.addr)
            }
            _ => return,
        };
        let me = SockKey {
            family,
            local_port: md.local_port,
            remote_port: port as u32,
            local_addr: local,
            remote_addr: remote,
        };
        let mut peer = me.peer();
        let _ = SOCKS.redirect_msg(ctx, &mut peer, BPF_F_INGRESS as u64);
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 4] = *b"GPL\0";
}
