//! The SSE upstream of `cargo xtask bench stream` (see `flexinfer_test_support::stream::upstream`):
//!
//! `sse-upstream --listen ADDR [--listen ADDR ...] [--events N] [--interval-ms D] [--bulk]`
//!
//! One thread per listening address (named u0, u1, ... in `X-Upstream`); runs until killed.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use flexinfer_test_support::harness::os::raise_nofile_limit;
use flexinfer_test_support::stream::flags::Flags;
use flexinfer_test_support::stream::upstream::{serve, Pacing};

fn main() {
    if let Err(e) = run() {
        eprintln!("sse-upstream: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let f = Flags::parse(std::env::args().skip(1))?;
    f.only(&["listen", "events", "interval-ms", "bulk"])?;
    let listen: Vec<SocketAddr> = f.all("listen")?;
    if listen.is_empty() {
        return Err("give at least one --listen ADDR".into());
    }
    let pacing = Pacing {
        events: f.get("events", 50)?,
        interval: Duration::from_millis(f.get("interval-ms", 20)?),
        bulk: f.has("bulk"),
    };
    raise_nofile_limit().map_err(|e| format!("raising the open-files limit: {e}"))?;
    let mut threads = Vec::new();
    for (i, addr) in listen.into_iter().enumerate() {
        let l = TcpListener::bind(addr).map_err(|e| format!("binding {addr}: {e}"))?;
        threads.push(std::thread::spawn(move || {
            serve(l, pacing, &format!("u{i}"))
        }));
    }
    println!("listening");
    for t in threads {
        match t.join() {
            Ok(Err(e)) => return Err(format!("serving: {e}")),
            Err(_) => return Err("a server thread panicked".into()),
            Ok(Ok(())) => {}
        }
    }
    Ok(())
}
