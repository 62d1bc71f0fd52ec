//! Test helper: opens and holds TCP connections on command, from whatever cgroup it was
//! started in (the eBPF tests start it inside their child cgroup).
//!
//! stdin commands, one per line, each answered on stdout with `ok [value]` or `err <why>`:
//! - `open <addr> <n>`: connect n sockets and hold them
//! - `close <n>`: close the n oldest
//!
//! EOF exits.
#![forbid(unsafe_code)]

use std::io::{BufRead, Write};
use std::net::TcpStream;

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
