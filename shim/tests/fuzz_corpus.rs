//! The `shim_answer` fuzz target's inputs as regression tests on stable: every file of
//! `fuzz/seeds/shim_answer/` (committed) and `fuzz/corpus/shim_answer/` (what a local fuzz run
//! kept; not committed, read when present) goes through what the target calls,
//! `wire::unary` with the file as the peer's side of the connection and `hpack::Decoder` on
//! the file as one header block, with the target's assertions (no panic, an answer within the
//! shim's bounds, an error with a message) and two of its own: what the shim writes back is
//! bounded by what it read, and a seed named `ok-*` is answered while one named `refused-*`
//! is refused (the protocol cases HTTP/2 says must fail). The fuzz run itself stays a manual
//! step (fuzz/Cargo.toml, BENCHMARKS.md's "Fuzzing").

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use credbroker_shim::{hpack, wire};

/// The peer, as in fuzz/fuzz_targets/shim_answer.rs: its side of the connection is the
/// input; what the shim writes is counted.
struct Peer<'a> {
    input: &'a [u8],
    written: usize,
}

impl Read for Peer<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Peer<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The request the target sends.
const REQUEST: &[u8] = b"request";

/// What the shim writes before reading anything: the preface, its SETTINGS, a WINDOW_UPDATE,
/// the request's HEADERS and DATA (about 150 bytes), with room to spare.
const FIRST_WRITE: usize = 512;

/// One input through the target's entry points; `Ok(true)` when the call was answered.
fn replay(data: &[u8]) -> Result<bool, String> {
    let mut peer = Peer {
        input: data,
        written: 0,
    };
    let answered = match wire::unary(&mut peer, "/credbroker.v1.TokenService/GetToken", REQUEST) {
        Ok(answer) => {
            if answer.body.len() > wire::MAX_ANSWER_BYTES {
                return Err(format!("an answer of {} bytes", answer.body.len()));
            }
            if answer.code != 0 && !answer.body.is_empty() {
                return Err("an error status with a message".into());
            }
            let _ = wire::error_info(&answer.details);
            true
        }
        Err(e) if e.to_string().is_empty() => return Err("an error without a message".into()),
        Err(_) => false,
    };
    // Every reply (a SETTINGS ACK, a PING ACK, a WINDOW_UPDATE pair) answers at least as many
    // bytes of input as it takes: a peer cannot make the shim write more than it sends.
    if peer.written > FIRST_WRITE + 2 * data.len() {
        return Err(format!(
            "{} bytes written for {} read",
            peer.written,
            data.len()
        ));
    }
    if let Ok(fields) = hpack::Decoder::default().decode(data) {
        let total: usize = fields.iter().map(|(n, v)| n.len() + v.len()).sum();
        if total > hpack::MAX_HEADER_LIST {
            return Err(format!("a header list of {total} bytes"));
        }
    }
    Ok(answered)
}

fn files_of(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a readable directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_seed_and_corpus_input_replays_within_bounds() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let seeds = files_of(&fuzz.join("seeds/shim_answer"));
    assert!(
        seeds.len() >= 8,
        "the committed seeds are missing: {seeds:?}"
    );
    let corpus = files_of(&fuzz.join("corpus/shim_answer"));
    let mut failures = Vec::new();
    for path in seeds.iter().chain(&corpus) {
        let data = std::fs::read(path).expect("a readable input");
        let name = path.file_name().unwrap().to_string_lossy();
        match replay(&data) {
            Err(why) => failures.push(format!("{}: {why}", path.display())),
            Ok(false) if name.starts_with("ok-") => {
                failures.push(format!("{}: refused", path.display()));
            }
            Ok(true) if name.starts_with("refused-") => {
                failures.push(format!("{}: answered", path.display()));
            }
            Ok(_) => {}
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
