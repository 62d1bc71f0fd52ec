//! Test helper: opens and holds TCP connections on command, from whatever cgroup it was
//! started in (the eBPF tests start it inside their child cgroup).
//!
//! stdin commands, one per line, each answered on stdout with `ok [value]` or `err <why>`:
//! - `open <addr> <n>`: connect n sockets and hold them
//! - `close <n>`: close the n oldest
//! - `serve`: start an echo server on 127.0.0.1 (inside this cgroup); answers `ok <addr>`
//! - `pingpong <bytes> <rounds>`: on the newest connection, send `bytes` and read them back
//!   `rounds` times; answers `ok <elapsed ns>` (fails if the echo differs)
//!
//! EOF exits.
#![forbid(unsafe_code)]

use std::io::{BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

fn echo(mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

fn serve() -> Result<String, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || echo(s));
        }
    });
    Ok(addr.to_string())
}

fn pingpong(s: &mut TcpStream, bytes: usize, rounds: u64) -> Result<String, String> {
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let out: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let mut back = vec![0u8; bytes];
    let start = Instant::now();
    for _ in 0..rounds {
        s.write_all(&out).map_err(|e| format!("write: {e}"))?;
        s.read_exact(&mut back).map_err(|e| format!("read: {e}"))?;
    }
    let elapsed = start.elapsed();
    if back != out {
        return Err("echo differs".into());
    }
    Ok(elapsed.as_nanos().to_string())
}

fn main() {
    let mut held: Vec<TcpStream> = Vec::new();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply: Result<String, String> = match words.as_slice() {
            ["open", addr, n] => (|| {
                let n: usize = n.parse().map_err(|e| format!("{e}"))?;
                for _ in 0..n {
                    held.push(
                        TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?,
                    );
                }
                Ok(String::new())
            })(),
            ["close", n] => match n.parse::<usize>() {
                Ok(n) if n <= held.len() => {
                    held.drain(..n);
                    Ok(String::new())
                }
                _ => Err(format!("cannot close {n} of {}", held.len())),
            },
            ["serve"] => serve(),
            ["pingpong", bytes, rounds] => match (bytes.parse(), rounds.parse(), held.last_mut()) {
                (Ok(b), Ok(r), Some(s)) => pingpong(s, b, r),
                _ => Err("pingpong needs <bytes> <rounds> and an open connection".into()),
            },
            _ => Err(format!("unknown command {line:?}")),
        };
        let msg = match reply {
            Ok(v) if v.is_empty() => "ok".to_string(),
            Ok(v) => format!("ok {v}"),
            Err(e) => format!("err {e}"),
        };
        if writeln!(out, "{msg}").and_then(|_| out.flush()).is_err() {
            break;
        }
    }
}
