//! The eBPF data plane: a node-wide, crash-safe set of connection bits per pod, from which
//! requests in flight are counted.
//!
//! `flexinfer_sockops` (sock_ops, attached to a cgroup2) sees every TCP socket of the
//! processes in that cgroup. When an outgoing connection to a pod listed in BACKENDS becomes
//! established, it claims a free bit of that pod in PODS (one compare-and-swap on one word),
//! marks it busy (a connection is opened to carry a request) and remembers the socket (cookie
//! -> slot and bit in CONNS). When that socket leaves ESTABLISHED (close, reset, or its
//! process dying) it clears the bit's busy, registered and claimed flags, in that order. A
//! proxy that pools the connection registers it (learns its bit) and flips its busy flag at
//! each request's start and end with atomic operations on the mmapped PODS array; nothing the
//! proxy does or fails to do can outlive the socket, because the kernel clears the bit when the
//! socket closes. Every change is a single atomic operation: there is no counter to update
//! alongside a flag, so no kill point can leave phantom load or a wrapped count.
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
    use core::intrinsics::{atomic_and, atomic_cxchg, atomic_or, AtomicOrdering};

    use aya_ebpf::{
        bindings::BPF_NOEXIST,
        btf_maps::{Array, HashMap},
        helpers::generated::{bpf_get_prandom_u32, bpf_get_socket_cookie},
        macros::{btf_map, sock_ops},
        programs::SockOpsContext,
        EbpfContext,
    };
    use routing_common::{
        remote_port_to_host, BackendKey, ConnSlot, PodConns, BPF_F_MMAPABLE, CONN_WORDS, FAMILY_V4,
        FAMILY_V6, MAX_PODS, MAX_TRACKED_CONNS,
    };

    // Kernel constants (uapi/linux/bpf.h), fixed ABI.
    const BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB: u32 = 4;
    const BPF_SOCK_OPS_STATE_CB: u32 = 10;
    const BPF_SOCK_OPS_STATE_CB_FLAG: u32 = 1 << 2;
    const BPF_TCP_ESTABLISHED: u32 = 1;

    /// Attempts per word to win the compare-and-swap against concurrent claims.
    const CLAIM_TRIES: u32 = 4;

    #[btf_map]
    static BACKENDS: HashMap<BackendKey, u32, { MAX_PODS as usize }> = HashMap::new();

    #[btf_map]
    static PODS: Array<PodConns, { MAX_PODS as usize }, BPF_F_MMAPABLE> = Array::new();

    #[btf_map]
    static CONNS: HashMap<u64, ConnSlot, { MAX_TRACKED_CONNS as usize }> = HashMap::new();

    #[sock_ops]
    pub fn flexinfer_sockops(ctx: SockOpsContext) -> u32 {
        try_sockops(&ctx);
        // sock_ops return values are ignored except for a few ops we do not handle.
        1
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

    /// Index (0..64) of the one bit set in `b`, without a count-trailing-zeros instruction.
    #[inline(always)]
    fn bit_index(b: u64) -> u32 {
        let (mut n, mut v) = (0u32, b);
        if v & 0xffff_ffff == 0 {
            n += 32;
            v >>= 32;
        }
        if v & 0xffff == 0 {
            n += 16;
            v >>= 16;
        }
        if v & 0xff == 0 {
            n += 8;
            v >>= 8;
        }
        if v & 0xf == 0 {
            n += 4;
            v >>= 4;
        }
        if v & 0x3 == 0 {
            n += 2;
            v >>= 2;
        }
        if v & 0x1 == 0 {
            n += 1;
        }
        n
    }

    /// The group of bit `bit` (`& (CONN_WORDS - 1)` keeps it provably in bounds for the
    /// verifier) and the bit's mask in it.
    #[inline(always)]
    fn group_of(bit: u32) -> (usize, u64) {
        (((bit / 64) as usize) & (CONN_WORDS - 1), 1u64 << (bit % 64))
    }

    /// Clear `mask` in `*p` atomically (the previous value is not needed).
    #[inline(always)]
    fn clear(p: *mut u64, mask: u64) {
        // SAFETY: `p` points into a PODS value valid for this program run; the atomic AND is
        // atomic against other CPUs and the userspace writers of the mmapped array.
        unsafe {
            atomic_and::<u64, u64, { AtomicOrdering::SeqCst }>(p, !mask);
        }
    }

    /// Claim a free connection bit of `pod` and mark it busy; returns its index.
    fn claim(pod: *mut PodConns) -> Option<u32> {
        // A random first word spreads claims and makes reuse of a just-released bit unlikely.
        // SAFETY: the helper takes no arguments and has no preconditions.
        let start = unsafe { bpf_get_prandom_u32() } as usize;
        for i in 0..CONN_WORDS {
            let w = (start + i) & (CONN_WORDS - 1);
            // SAFETY: `pod` is a PODS value pointer and `w < CONN_WORDS`.
            let word = unsafe { core::ptr::addr_of_mut!((*pod).live[w]) };
            for _ in 0..CLAIM_TRIES {
                // SAFETY: reading a u64 of a valid map value; other CPUs change it atomically.
                let old = unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*word).claimed)) };
                if old == u64::MAX {
                    break;
                }
                let bit = !old & old.wrapping_add(1);
                // SAFETY: as above; the CAS is atomic against other CPUs and userspace.
                let (_, won) = unsafe {
                    atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                        core::ptr::addr_of_mut!((*word).claimed),
                        old,
                        old | bit,
                    )
                };
                if won {
                    // A new connection carries a request; nobody has registered it yet.
                    // SAFETY: as above.
                    unsafe {
                        atomic_or::<u64, u64, { AtomicOrdering::SeqCst }>(
                            core::ptr::addr_of_mut!((*word).busy),
                            bit,
                        );
                    }
                    // SAFETY: `pod` points at a valid PODS value and `w < CONN_WORDS`.
                    clear(
                        unsafe { core::ptr::addr_of_mut!((*pod).registered[w]) },
                        bit,
                    );
                    return Some(w as u32 * 64 + bit_index(bit));
                }
            }
        }
        None
    }

    /// Release bit `bit` of `pod`: busy and registered first, the claim last, so the bit is
    /// never claimed again while it still reads as busy.
    fn release(pod: *mut PodConns, bit: u32) {
        let (w, mask) = group_of(bit);
        // SAFETY: `pod` points at a valid PODS value and `w < CONN_WORDS`.
        unsafe {
            clear(core::ptr::addr_of_mut!((*pod).registered[w]), mask);
            clear(core::ptr::addr_of_mut!((*pod).live[w].busy), mask);
            clear(core::ptr::addr_of_mut!((*pod).live[w].claimed), mask);
        }
    }

    fn on_active_established(ctx: &SockOpsContext) {
        let Some(key) = remote_key(ctx) else { return };
        // SAFETY: the value is copied out at once; userspace writes only whole entries.
        let Some(slot) = (unsafe { BACKENDS.get(key) }).copied() else {
            return;
        };
        let Some(pod) = PODS.get_ptr_mut(slot) else {
            return;
        };
        let Some(bit) = claim(pod) else {
            // Every bit of this pod is taken: the connection is not counted at all.
            return;
        };
        // SAFETY: `ctx.as_ptr()` is this program's `bpf_sock_ops`, which the cookie helper accepts.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        // Remember the socket, so that its close releases exactly this bit.
        if CONNS
            .insert(cookie, ConnSlot { slot, bit }, BPF_NOEXIST as u64)
            .is_err()
        {
            release(pod, bit);
            return;
        }
        if ctx
            .set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32)
            .is_err()
        {
            let _ = CONNS.remove(cookie);
            release(pod, bit);
        }
    }

    fn on_state_change(ctx: &SockOpsContext) {
        // arg(1) is the new state. Leaving ESTABLISHED (FIN sent or received, reset, close)
        // ends the connection for the gauge; later transitions find no entry and do nothing.
        if ctx.arg(1) == BPF_TCP_ESTABLISHED {
            return;
        }
        // SAFETY: see `on_active_established`.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        // SAFETY: the value is copied out before the entry is removed.
        let Some(entry) = (unsafe { CONNS.get(cookie) }).copied() else {
            return;
        };
        // Whoever removes the entry releases the bit, so a racing second callback cannot.
        if CONNS.remove(cookie).is_ok() {
            if let Some(pod) = PODS.get_ptr_mut(entry.slot) {
                release(pod, entry.bit);
            }
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
