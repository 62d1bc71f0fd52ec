//! The Mooncake trace format (FAST '25 release): one JSON object per line with the arrival
//! `timestamp` (ms), `input_length` and `output_length` (tokens) and `hash_ids`, the prompt as
//! 512-token block ids where a block id names its whole prefix.

use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    pub timestamp: u64,
    pub input_length: u64,
    pub output_length: u64,
    pub hash_ids: Vec<u64>,
}

/// Read up to `limit` requests of a trace file (all with `None`), in arrival order.
pub fn load(path: &Path, limit: Option<usize>) -> anyhow::Result<Vec<TraceRequest>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let r: TraceRequest = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: not a trace request", path.display(), n + 1))?;
        out.push(r);
    }
    // Arrival order is what the simulation replays; a stable sort keeps ties in file order.
    out.sort_by_key(|r| r.timestamp);
    Ok(out)
}

/// Write requests as a trace file.
pub fn write(path: &Path, requests: &[TraceRequest]) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for r in requests {
        serde_json::to_writer(&mut f, r)?;
        f.write_all(b"\n")?;
    }
    f.flush()?;
    Ok(())
}
