#!/usr/bin/env bash
# The benchmarks (BENCHMARKS.md): builds the release broker, the size-optimised shim and the
# bench, then runs everything and prints a markdown report on stdout (progress on stderr).
# Arguments go to credbroker-bench: `bench/run.sh --smoke` is the seconds-long CI variant.
# First builds the anchors section's Go plugins and client-go fleet (e2e/anchors.sh, from the
# Go module proxy, once per version: seconds when cached); credbroker-bench itself never
# builds them, so `cargo run -p credbroker-bench -- --smoke` (CI) measures only what is built.
set -euo pipefail
cd "$(dirname "$0")/.."
only=
prev=
for a in "$@"; do [ "$prev" = --only ] && only=$a; prev=$a; done
case ",${only:-anchors}," in
    *,anchors,*) e2e/anchors.sh ;;  # stdout stays the report's: anchors.sh logs to stderr
esac
# Separate builds: features of the packages in one build unify, and the broker measured
# must be the one `cargo build --release -p credbroker` ships, not one with the bench's.
cargo build --locked --release -p credbroker -p credbroker-shim >&2
cargo build --locked --release -p credbroker-bench >&2
cargo build --locked --profile shim -p credbroker-shim >&2
exec target/x86_64-unknown-linux-gnu/release/credbroker-bench "$@"
