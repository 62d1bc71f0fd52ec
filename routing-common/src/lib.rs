//! Types shared by the kernel (routing-ebpf) and user (routing-userspace) sides.
//!
//! Everything here is `#[repr(C)]`, `Copy` and free of hidden padding, so the bytes the
//! kernel hashes are exactly the bytes userspace wrote. Addresses are kept the way the kernel
//! hands them to a sock_ops program: each 32-bit word holds four address bytes in network
//! order (so a word's *memory* is the wire bytes), ports in host order. With the `user`
//! feature the types implement `aya::Pod` so aya maps can carry them.
//!
//! The load of a pod is a set of bits, one per connection to it (see [`PodConns`]): the kernel
//! claims a connection's bit when it is established and releases it when it closes, and a
//! busy bit says whether the connection carries a request right now. Every change is one
//! atomic operation on one word, so no kill point can leave a counter half-updated: the load
//! is counted from the bits when it is read.
#![no_std]

/// Number of pod slots in the load gauge.
pub const MAX_PODS: u32 = 4096;

/// Connections the kernel can track at once (socket cookie -> slot and bit). A connection that
/// does not fit is not counted at all (never counted up without a matching count down).
pub const MAX_TRACKED_CONNS: u32 = 65536;

/// 64-bit words of connection bits per pod.
pub const CONN_WORDS: usize = 8;
/// Connections per pod (from this node) the gauge can tell apart; more are not counted.
pub const CONNS_PER_POD: u32 = (CONN_WORDS * 64) as u32;

/// Version of the pinned layout; pins live in a directory of this name under the pin dir, so
/// a node with the pins of another layout is recognized (and cleaned up) rather than misread.
pub const LAYOUT: &str = "v2";

/// `AF_INET`, as in the kernel's `bpf_sock_ops.family`.
pub const FAMILY_V4: u32 = 2;
/// `AF_INET6`.
pub const FAMILY_V6: u32 = 10;

/// Map names, as they appear in the object, under the pin directory and in `bpftool`.
pub mod maps {
    /// `HashMap<BackendKey, u32>`: pod address -> slot (written by userspace).
    pub const BACKENDS: &str = "BACKENDS";
    /// `Array<PodConns>` (BPF_F_MMAPABLE): the connection bits of each slot.
    pub const PODS: &str = "PODS";
    /// `HashMap<u64, ConnSlot>`: socket cookie -> slot and bit of every connection counted.
    pub const CONNS: &str = "CONNS";
    /// Every map the loader pins.
    pub const ALL: [&str; 3] = [BACKENDS, PODS, CONNS];
    /// The connection-count array of the previous layout (pinned at the top of the pin dir).
    pub const LEGACY_LOAD: &str = "LOAD";
}

/// Program names (the entry point function names in routing-ebpf).
pub mod programs {
    /// The sock_ops connection gauge.
    pub const SOCK_OPS: &str = "flexinfer_sockops";
}

/// `BPF_F_MMAPABLE`: the map's memory can be mmapped by userspace.
pub const BPF_F_MMAPABLE: usize = 0x400;

/// A pod address: key of the BACKENDS map (24 bytes, no padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct BackendKey {
    /// [`FAMILY_V4`] or [`FAMILY_V6`]; IPv4-mapped IPv6 addresses are stored as IPv4.
    pub family: u32,
    /// Port in host order.
    pub port: u32,
    /// Address words in the kernel's layout (network-order bytes); IPv4 uses word 0 only.
    pub addr: [u32; 4],
}

impl BackendKey {
    /// An IPv4 key from the kernel's `remote_ip4` word and a host-order port.
    pub const fn v4(ip4: u32, port: u16) -> Self {
        Self {
            family: FAMILY_V4,
            port: port as u32,
            addr: [ip4, 0, 0, 0],
        }
    }

    /// An IPv6 key from the kernel's `remote_ip6` words; a v4-mapped address becomes IPv4.
    pub const fn v6(ip6: [u32; 4], port: u16) -> Self {
        if is_v4_mapped(ip6) {
            Self::v4(ip6[3], port)
        } else {
            Self {
                family: FAMILY_V6,
                port: port as u32,
                addr: ip6,
            }
        }
    }

    /// Build a key from address bytes in network order (4 or 16 of them) and a host port.
    /// Pure byte shuffling, so both sides agree on the layout.
    pub const fn from_octets_v4(octets: [u8; 4], port: u16) -> Self {
        Self::v4(u32::from_ne_bytes(octets), port)
    }

    /// See [`BackendKey::from_octets_v4`].
    pub const fn from_octets_v6(o: [u8; 16], port: u16) -> Self {
        Self::v6(
            [
                u32::from_ne_bytes([o[0], o[1], o[2], o[3]]),
                u32::from_ne_bytes([o[4], o[5], o[6], o[7]]),
                u32::from_ne_bytes([o[8], o[9], o[10], o[11]]),
                u32::from_ne_bytes([o[12], o[13], o[14], o[15]]),
            ],
            port,
        )
    }
}

/// Whether the kernel words hold `::ffff:a.b.c.d`.
pub const fn is_v4_mapped(w: [u32; 4]) -> bool {
    w[0] == 0 && w[1] == 0 && w[2] == u32::from_ne_bytes([0, 0, 0xff, 0xff])
}

/// Decode the sock_ops `remote_port` field to a host-order port. The kernel stores
/// the network-order 16-bit port in the upper half of the word on little-endian machines
/// (and in the lower half on older layouts); either way one shift and a swap recover it.
pub const fn remote_port_to_host(raw: u32) -> u16 {
    let be = if raw > 0xffff { raw >> 16 } else { raw };
    u16::from_be(be as u16)
}

/// One group of 64 connections of a pod: bit `i` of both words is the same connection.
///
/// - `claimed`: the connection exists (set by the kernel when it is established, cleared when
///   it closes);
/// - `busy`: it carries a request now (set by the kernel when it is established, since a
///   connection is opened for a request; then set and cleared by the proxy that registered it
///   at each request's start and end; cleared by the kernel when it closes).
///
/// A pod's load is the number of bits set in both: a busy bit left on a connection that has
/// closed (a proxy marking a connection the server just closed) counts for nothing, and is
/// reset when the bit is claimed again.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LiveWord {
    pub claimed: u64,
    pub busy: u64,
}

/// The connection bits of one pod (the value of [`maps::PODS`]). The words a load read needs
/// come first and together (two cache lines); `registered` marks connections a proxy pools
/// and marks requests on (set by that proxy, cleared by the kernel when the connection
/// closes). An unregistered connection stays busy for its whole life: one connection, one
/// request, as for any client that does not pool.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PodConns {
    pub live: [LiveWord; CONN_WORDS],
    pub registered: [u64; CONN_WORDS],
}

impl PodConns {
    /// Requests in flight: connections both claimed and busy.
    pub fn in_flight(&self) -> u32 {
        self.live
            .iter()
            .map(|w| (w.claimed & w.busy).count_ones())
            .sum()
    }
}

/// Where a counted connection's bit is (the value of [`maps::CONNS`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ConnSlot {
    /// The pod's kernel slot.
    pub slot: u32,
    /// The connection's bit: word `bit / 64`, bit `bit % 64`.
    pub bit: u32,
}

const _: () = {
    assert!(core::mem::size_of::<BackendKey>() == 24);
    assert!(core::mem::size_of::<LiveWord>() == 16);
    assert!(core::mem::size_of::<PodConns>() == 24 * CONN_WORDS);
    assert!(core::mem::size_of::<ConnSlot>() == 8);
};

#[cfg(feature = "user")]
#[allow(unsafe_code)]
mod user {
    // SAFETY: the types are `#[repr(C)]`, `Copy`, made only of integers, and their sizes are
    // asserted above to equal the sum of their fields (no padding bytes to leak or compare).
    unsafe impl aya::Pod for super::BackendKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ConnSlot {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PodConns {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_mapped_v6_is_stored_as_v4() {
        let v4 = BackendKey::from_octets_v4([127, 0, 0, 1], 8080);
        let mut o = [0u8; 16];
        o[10] = 0xff;
        o[11] = 0xff;
        o[12..].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(BackendKey::from_octets_v6(o, 8080), v4);
    }

    #[test]
    fn v4_word_memory_is_network_order() {
        let k = BackendKey::from_octets_v4([10, 1, 2, 3], 80);
        assert_eq!(k.addr[0].to_ne_bytes(), [10, 1, 2, 3]);
        assert_eq!(k.port, 80);
        assert_eq!(k.family, FAMILY_V4);
    }

    #[test]
    fn remote_port_layouts_decode() {
        let port: u16 = 8080;
        let be_as_loaded = u16::from_ne_bytes(port.to_be_bytes()) as u32;
        assert_eq!(remote_port_to_host(be_as_loaded << 16), port);
        assert_eq!(remote_port_to_host(be_as_loaded), port);
    }
}
