//! The load generator of `cargo xtask bench stream` (see
//! `flexinfer_test_support::stream::load`). Prints one `RESULT key=value ...` line.
//!
//! `sse-load --target ADDR [--target ADDR ...] --connections N [--threads T] [--body JSON]
//!  [--path P] [--idle | --idle-after-answer] [--connect-rate R] [--open-timeout-ms MS]
//!  [--warmup-ms MS] [--duration-ms MS] [--watch NAME=PID ...]`

use std::net::SocketAddr;
use std::time::Duration;

use flexinfer_test_support::harness::http::Request;
use flexinfer_test_support::harness::os::raise_nofile_limit;
use flexinfer_test_support::stream::flags::Flags;
use flexinfer_test_support::stream::load::{result_line, run, ClientMode, LoadConfig};

const FLAGS: [&str; 12] = [
    "target",
    "connections",
    "threads",
    "body",
    "path",
    "idle",
    "idle-after-answer",
    "connect-rate",
    "open-timeout-ms",
    "warmup-ms",
    "duration-ms",
    "watch",
];

fn main() {
    match config().and_then(|c| run(&c).map_err(|e| e.to_string())) {
        Ok(r) => println!("{}", result_line(&r)),
        Err(e) => {
            eprintln!("sse-load: {e}");
            std::process::exit(1);
        }
    }
}

fn config() -> Result<LoadConfig, String> {
    let f = Flags::parse(std::env::args().skip(1))?;
    f.only(&FLAGS)?;
    let targets: Vec<SocketAddr> = f.all("target")?;
    let host = targets
        .first()
        .ok_or("give at least one --target ADDR")?
        .to_string();
    let body: String = f.get(
        "body",
        r#"{"model":"bench-model","stream":true}"#.to_owned(),
    )?;
    let path: String = f.get("path", "/v1/chat/completions".to_owned())?;
    let request = Request::post(&path, body.as_bytes())
        .keep_alive()
        .encode(&host);
    let watch = f
        .all::<String>("watch")?
        .into_iter()
        .map(|w| {
            let (name, pid) = w
                .split_once('=')
                .ok_or(format!("--watch {w:?}: NAME=PID"))?;
            let pid = pid.parse().map_err(|_| format!("--watch {w:?}: PID"))?;
            Ok((name.to_owned(), pid))
        })
        .collect::<Result<_, String>>()?;
    raise_nofile_limit().map_err(|e| format!("raising the open-files limit: {e}"))?;
    let ms = |name, default| f.get(name, default).map(Duration::from_millis);
    let client = match (f.has("idle"), f.has("idle-after-answer")) {
        (false, false) => ClientMode::Stream,
        (true, false) => ClientMode::Idle,
        (false, true) => ClientMode::IdleAfterAnswer,
        (true, true) => return Err("--idle and --idle-after-answer exclude each other".into()),
    };
    Ok(LoadConfig {
        targets,
        connections: f.get("connections", 100)?,
        threads: f.get("threads", 1)?,
        request,
        client,
        connect_rate: f.get("connect-rate", 4000)?,
        open_timeout: ms("open-timeout-ms", 60_000)?,
        warmup: ms("warmup-ms", 2000)?,
        duration: ms("duration-ms", 10_000)?,
        watch,
    })
}
