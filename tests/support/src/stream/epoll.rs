//! The few epoll(7) calls the stream upstream and load generator need, behind a safe type.
//!
//! std has nonblocking sockets but no readiness API; these three syscalls are all that is
//! missing, so they are wrapped here rather than pulling in an event-loop crate. Level-triggered
//! throughout: a socket that still has data is reported again, so a handler may stop early.
#![allow(unsafe_code)] // see the SAFETY lines

use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// Readable (and peer hang-up).
pub const READ: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
/// Readable and writable.
pub const READ_WRITE: u32 = READ | libc::EPOLLOUT as u32;

/// One readiness report: the token given at registration and the event bits.
#[derive(Debug, Clone, Copy)]
pub struct Ready {
    pub token: u64,
    pub events: u32,
}

impl Ready {
    pub fn writable(&self) -> bool {
        self.events & libc::EPOLLOUT as u32 != 0
    }

    /// Readable, or an error or hang-up (a read then tells which).
    pub fn readable(&self) -> bool {
        self.events & (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32
            != 0
    }
}

pub struct Epoll {
    fd: RawFd,
    buf: Vec<libc::epoll_event>,
}

impl Epoll {
    /// An epoll instance that reports up to `batch` sockets per wait.
    pub fn new(batch: usize) -> io::Result<Self> {
        // SAFETY: epoll_create1 takes no pointers; the fd it returns is owned by `Epoll`.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let empty = libc::epoll_event { events: 0, u64: 0 };
        Ok(Self {
            fd,
            buf: vec![empty; batch.max(1)],
        })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` lives across the call; the kernel copies it. `fd` is a socket the caller
        // owns (a stale fd fails with EBADF, never touches memory).
        if unsafe { libc::epoll_ctl(self.fd, op, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn add(&self, s: &impl AsRawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, s.as_raw_fd(), token, events)
    }

    pub fn modify(&self, s: &impl AsRawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, s.as_raw_fd(), token, events)
    }

    pub fn delete(&self, s: &impl AsRawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, s.as_raw_fd(), 0, 0)
    }

    /// Wait up to `timeout_ms` (-1: forever, 0: poll) and return what is ready.
    pub fn wait(&mut self, timeout_ms: i32) -> io::Result<Vec<Ready>> {
        // SAFETY: the kernel writes at most `buf.len()` entries into `buf`, which we own.
        let n = unsafe {
            libc::epoll_wait(
                self.fd,
                self.buf.as_mut_ptr(),
                self.buf.len() as libc::c_int,
                timeout_ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(Vec::new())
            } else {
                Err(e)
            };
        }
        Ok(self.buf[..n as usize]
            .iter()
            .map(|e| Ready {
                token: e.u64,
                events: e.events,
            })
            .collect())
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: we own the fd and close it once.
        unsafe { libc::close(self.fd) };
    }
}

/// Let `listener` queue up to `backlog` connections not yet accepted (std binds with 128, too
/// few when thousands of clients connect at once; listen(2) again only changes the backlog).
pub fn set_backlog(listener: &std::net::TcpListener, backlog: i32) -> io::Result<()> {
    // SAFETY: listen takes no pointers; the fd is the listener's own.
    if unsafe { libc::listen(listener.as_raw_fd(), backlog) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn reports_a_readable_socket_by_its_token() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        set_backlog(&l, 1024).unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let mut ep = Epoll::new(8).unwrap();
        ep.add(&s, 7, READ).unwrap();
        assert!(ep.wait(0).unwrap().is_empty());
        c.write_all(b"x").unwrap();
        let ready = ep.wait(5000).unwrap();
        assert_eq!(ready.len(), 1);
        assert!(ready[0].token == 7 && ready[0].readable() && !ready[0].writable());
        ep.modify(&s, 8, READ_WRITE).unwrap();
        let ready = ep.wait(5000).unwrap();
        assert!(ready[0].token == 8 && ready[0].writable());
        ep.delete(&s).unwrap();
        assert!(ep.wait(0).unwrap().is_empty());
    }
}
