//! Gzip of export bodies (`OTEL_EXPORTER_OTLP_COMPRESSION=gzip`), for a collector across a
//! network: spans repeat their attribute names and values, and a batch shrinks several times.
//!
//! One deflate state serves every export (reset between them): a compressor's state is a few
//! hundred KB, and one made per export would come on fresh pages each time. Each body is one
//! gzip member (RFC 1952): a ten-byte header (deflate, no flags, no time), the deflate stream at
//! the fastest level, then the CRC-32 and the length of what was compressed.

use flate2::{Compress, Compression, Crc, FlushCompress, Status};

/// The member header: magic, deflate, no flags, no modification time, no extra flags, OS
/// unknown.
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];

/// Room to add to the output when deflate has filled it.
const GROW: usize = 16 * 1024;

pub struct Gzip {
    deflate: Compress,
}

impl std::fmt::Debug for Gzip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gzip")
    }
}

impl Default for Gzip {
    fn default() -> Self {
        Self {
            deflate: Compress::new(Compression::fast(), false),
        }
    }
}

impl Gzip {
    /// `input` as one gzip member, in `out` (emptied first; its room is reused).
    pub fn compress(&mut self, input: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.reserve(HEADER.len() + input.len() / 4 + 64);
        out.extend_from_slice(&HEADER);
        self.deflate.reset();
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(GROW);
            }
            let read = usize::try_from(self.deflate.total_in()).expect("a body fits in memory");
            let status = self
                .deflate
                .compress_vec(&input[read..], out, FlushCompress::Finish)
                .expect("deflate over a buffer cannot fail");
            if status == Status::StreamEnd {
                break;
            }
        }
        let mut crc = Crc::new();
        crc.update(input);
        out.extend_from_slice(&crc.sum().to_le_bytes());
        // ISIZE: the input's length modulo 2^32.
        out.extend_from_slice(&(input.len() as u32).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn gunzip(body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(body)
            .read_to_end(&mut out)
            .expect("a gzip member");
        out
    }

    /// Whatever the input (empty, tiny, repetitive, random, larger than the first room), the
    /// member decompresses to it, and one state and one buffer serve every body in turn.
    #[test]
    fn every_body_decompresses_to_its_input() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let random: Vec<u8> = (0..300_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let repetitive: Vec<u8> = b"flexinfer.key_source\x12\x10session-header"
            .iter()
            .copied()
            .cycle()
            .take(400_000)
            .collect();
        let inputs: [&[u8]; 5] = [b"", b"a", &repetitive, &random, &repetitive[..1000]];
        let mut gzip = Gzip::default();
        let mut out = Vec::new();
        for input in inputs.iter().chain(inputs.iter()) {
            gzip.compress(input, &mut out);
            assert_eq!(gunzip(&out), *input, "{} bytes", input.len());
        }
        gzip.compress(&repetitive, &mut out);
        assert!(out.len() * 20 < repetitive.len(), "{} bytes", out.len());
    }
}
