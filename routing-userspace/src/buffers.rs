//! I/O buffers of connections between two requests, kept on their worker thread for the next
//! request that needs one.
//!
//! A connection between two requests holds no buffer (a keep-alive pool of thousands of idle
//! client connections, or of pooled upstream connections, would otherwise hold thousands of
//! buffers), so every request needs its buffers again: the client's read and response buffers
//! (`proxy::h1`) and the upstream request's write buffer (`upstream::h1`), all on the thread
//! that runs the request. From the allocator, a block of a few KiB costs a slow path each way;
//! from here, a pop and a push. At most `POOLED` (64) of each kind stay per thread, so the pools'
//! memory is bounded whatever the number of connections.

use std::cell::RefCell;
use std::thread::LocalKey;

use bytes::BytesMut;

/// Buffers of each kind kept per worker thread.
const POOLED: usize = 64;
/// A buffer grown past this (a large head or body) goes back to the allocator instead.
const LARGEST: usize = 16 * 1024;

/// A growable byte buffer the pool can empty and size up.
pub trait Buffer: Default + 'static {
    fn clear(&mut self);
    fn capacity(&self) -> usize;
}

impl Buffer for BytesMut {
    fn clear(&mut self) {
        BytesMut::clear(self);
    }
    fn capacity(&self) -> usize {
        BytesMut::capacity(self)
    }
}

impl Buffer for Vec<u8> {
    fn clear(&mut self) {
        Vec::clear(self);
    }
    fn capacity(&self) -> usize {
        Vec::capacity(self)
    }
}

/// One kind of buffer's pool on each thread.
type Shelf<B> = LocalKey<RefCell<Vec<B>>>;

thread_local! {
    static READ: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    static WRITE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer, pooled if one is there (a read buffer's room is reclaimed by its first
/// `reserve`).
fn take<B: Buffer>(shelf: &'static Shelf<B>) -> B {
    shelf.with(|p| p.borrow_mut().pop()).unwrap_or_default()
}

/// Give back a buffer whose bytes were all consumed or written out; kept unless it never grew,
/// grew past [`LARGEST`], or the shelf is full.
fn give<B: Buffer>(shelf: &'static Shelf<B>, mut buf: B) {
    buf.clear();
    if buf.capacity() == 0 || buf.capacity() > LARGEST {
        return;
    }
    shelf.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < POOLED {
            p.push(buf);
        }
    });
}

/// An empty read buffer.
pub fn read_buffer() -> BytesMut {
    take(&READ)
}

/// Give back a read buffer.
pub fn give_read_buffer(buf: BytesMut) {
    give(&READ, buf);
}

/// An empty response buffer.
pub fn write_buffer() -> Vec<u8> {
    take(&WRITE)
}

/// Give back a response buffer.
pub fn give_write_buffer(out: Vec<u8>) {
    give(&WRITE, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_empty_and_the_pool_is_bounded() {
        let mut b = BytesMut::with_capacity(4096);
        b.extend_from_slice(b"left over");
        give_read_buffer(b);
        let b = read_buffer();
        assert!(
            b.is_empty() && b.capacity() >= 4096,
            "the pooled one, emptied"
        );
        for _ in 0..POOLED + 10 {
            give_write_buffer(Vec::with_capacity(512));
        }
        assert_eq!(WRITE.with(|p| p.borrow().len()), POOLED);
        give_read_buffer(BytesMut::with_capacity(LARGEST * 2));
        assert_eq!(
            READ.with(|p| p.borrow().len()),
            0,
            "a grown buffer is not kept"
        );
        give_write_buffer(Vec::new());
        let mut fresh = write_buffer();
        assert!(
            fresh.capacity() >= 512,
            "a buffer that never grew is not kept"
        );
        fresh.extend_from_slice(b"x");
        give_write_buffer(fresh);
        assert!(write_buffer().is_empty());
    }
}
