#!/usr/bin/env bash
# The benchmarks (BENCHMARKS.md): builds the release broker, the size-optimised shim and the
# bench, then runs everything and prints a markdown report on stdout (progress on stderr).
# Arguments go to credbroker-bench: `bench/run.sh --smoke` is the seconds-long CI variant.
set -euo pipefail
cd "$(dirname "$0")/.."
# Separate builds: features of the packages in one build unify, and the broker measured
# must be the one `cargo build --release -p credbroker` ships, not one with the bench's.
cargo build --locked --release -p credbroker -p credbroker-shim >&2
cargo build --locked --release -p credbroker-bench >&2
cargo build --locked --profile shim -p credbroker-shim >&2
exec target/x86_64-unknown-linux-gnu/release/credbroker-bench "$@"
