//! What the broker's socket sends the shim, as the shim reads it: any bytes as the peer's
//! side of one HTTP/2 connection (`credbroker_shim::wire::unary`), and as one HPACK header
//! block. Never panics, always ends (the input is finite and every loop consumes it), and an
//! accepted answer is within the shim's bounds.
#![no_main]

use std::io::{self, Read, Write};

use libfuzzer_sys::fuzz_target;

use credbroker_shim::{hpack, wire};

/// The peer: its side of the connection is `input`; what the shim writes is dropped.
struct Peer<'a>(&'a [u8]);

impl Read for Peer<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Peer<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    match wire::unary(&mut Peer(data), "/credbroker.v1.TokenService/GetToken", b"request") {
        Ok(answer) => {
            assert!(answer.body.len() <= wire::MAX_ANSWER_BYTES);
            assert!(answer.code == 0 || answer.body.is_empty());
            let _ = wire::error_info(&answer.details);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    if let Ok(fields) = hpack::Decoder::default().decode(data) {
        let total: usize = fields.iter().map(|(n, v)| n.len() + v.len()).sum();
        assert!(total <= hpack::MAX_HEADER_LIST);
    }
});
