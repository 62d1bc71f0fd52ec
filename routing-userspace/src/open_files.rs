//! The open-files limit: raised at startup, and what bounds client connections.
//!
//! Why: a client connection with a request in flight holds two descriptors (the client's and
//! the pod's), so the limit on open files, more than `--max-client-connections`, bounds how
//! many streams a node relays. Container runtimes often start a process with a soft limit of
//! 1,024 and a far higher hard one; a proxy that kept 1,024 would fail accepts and upstream
//! connects past about 500 streams, as errors in the log and 502s. So `serve` raises the soft
//! limit to the hard one (what Go's runtime does for every Go server), and the hard one too
//! where it may (the chart's privileged container may, up to the kernel's `nr_open`), to what
//! `--max-client-connections` needs; then it caps client connections at what fits, so that a
//! full node answers 503 with Retry-After, counted, instead of failing accepts and connects.

use std::io;

/// The soft limit on open files before and after [`raise_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    pub before: u64,
    pub now: u64,
}

/// Raise this process's limit on open files: both limits to `wanted` where the process may
/// (CAP_SYS_RESOURCE; refused quietly otherwise), else the soft one to the hard one (no
/// privilege needed).
#[allow(unsafe_code)]
pub fn raise_limit(wanted: u64) -> io::Result<OpenFiles> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    if wanted > lim.rlim_max {
        let higher = libc::rlimit {
            rlim_cur: wanted,
            rlim_max: wanted,
        };
        // SAFETY: setrlimit reads the struct we pass. Without the privilege it fails (EPERM)
        // and changes nothing; `lim` stays as read.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &higher) } == 0 {
            lim = higher;
        }
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit reads the struct we pass; a soft limit up to the hard one is
        // always allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(OpenFiles {
        before,
        now: lim.rlim_cur,
    })
}

/// Descriptors kept for everything but client connections and the upstream connection each
/// one uses: listeners, idle pooled upstream connections, engine scrapes, the Kubernetes
/// watches, trace export, the eBPF maps and links.
pub fn reserved(limit: u64) -> u64 {
    (limit / 4).min(1024)
}

/// Open files that `connections` client connections need, each with its upstream connection,
/// beside the reserve.
pub fn needed_for(connections: usize) -> u64 {
    (connections as u64).saturating_mul(2).saturating_add(1024)
}

/// Client connections that fit under `limit` open files, each with one upstream connection.
pub fn client_connections_that_fit(limit: u64) -> usize {
    usize::try_from((limit - reserved(limit)) / 2).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_takes_two_descriptors_beside_a_reserve() {
        // A container runtime's common soft limit: about 380 streams, not 1,024.
        assert_eq!(client_connections_that_fit(1024), 384);
        // This project's machines: 20,000.
        assert_eq!(client_connections_that_fit(20_000), 9_488);
        // containerd 2's hard limit: the default --max-client-connections (16,384) fits.
        assert_eq!(client_connections_that_fit(524_288), 261_632);
        assert_eq!(client_connections_that_fit(0), 0);
    }

    #[test]
    fn what_connections_need_fits_them() {
        for connections in [0, 1, 384, 16_384] {
            let limit = needed_for(connections);
            assert!(
                client_connections_that_fit(limit) >= connections,
                "{connections}"
            );
        }
    }

    #[test]
    fn raising_reaches_the_hard_limit_at_least() {
        let files = raise_limit(0).expect("getrlimit works");
        assert!(files.now >= files.before);
        let again = raise_limit(0).expect("getrlimit works");
        assert_eq!(again.before, again.now, "already at the hard limit");
        assert_eq!(again.now, files.now);
    }
}
