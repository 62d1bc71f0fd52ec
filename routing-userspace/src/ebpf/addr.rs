//! A pod's address as the kernel keys it in `BACKENDS` (what the sock_ops program builds from a
//! connecting socket), and back.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use routing_common::{BackendKey, FAMILY_V4};

/// `BackendKey` for a socket address, as the kernel builds it from a connecting socket.
pub fn backend_key(addr: &SocketAddr) -> BackendKey {
    match addr {
        SocketAddr::V4(a) => BackendKey::from_octets_v4(a.ip().octets(), a.port()),
        SocketAddr::V6(a) => BackendKey::from_octets_v6(a.ip().octets(), a.port()),
    }
}

/// The socket address a BACKENDS key stands for.
pub fn key_addr(k: &BackendKey) -> SocketAddr {
    let ip = if k.family == FAMILY_V4 {
        IpAddr::V4(Ipv4Addr::from(k.addr[0].to_ne_bytes()))
    } else {
        let mut o = [0u8; 16];
        for (i, w) in k.addr.iter().enumerate() {
            o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        IpAddr::V6(Ipv6Addr::from(o))
    };
    SocketAddr::new(ip, k.port as u16)
}
