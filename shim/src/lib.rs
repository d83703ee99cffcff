//! The parts of `credbroker-shim` that read what the broker sends, as a library so the fuzz
//! target (`fuzz/fuzz_targets/shim_answer.rs`) and the tests reach them: the HTTP/2 client
//! of its one gRPC call ([`wire`]) and its HPACK decoder ([`hpack`]).

pub mod hpack;
pub mod wire;
