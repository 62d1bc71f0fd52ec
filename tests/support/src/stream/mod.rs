//! `bench stream`'s own processes, as libraries with a tiny bin each (`sse-upstream`,
//! `sse-load`, built in release by `cargo xtask bench stream`): a fast SSE upstream and a load
//! generator that holds thousands of streams and timestamps every event it reads.
//!
//! Both are single-threaded epoll loops (the load generator runs a few of them) over std's
//! nonblocking sockets: thousands of open streams cost memory per socket, not a thread each,
//! and neither becomes the bottleneck of what they measure (the direct row of the bench shows
//! what they reach with no proxy between them). They share the wire format in [`wire`].

pub mod epoll;
pub mod flags;
pub mod load;
pub mod upstream;
pub mod wire;
