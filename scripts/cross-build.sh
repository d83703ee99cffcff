#!/usr/bin/env bash
# Builds credbroker and credbroker-shim for another Linux architecture, static, from the same
# sources and Cargo.lock as the amd64 build, and checks what came out.
#
#   scripts/cross-build.sh --arch arm64 [--out DIR]
#
# The compiler: Debian's rustc (package rustc-web, 1.96) with its multiarch standard library
# (libstd-rust-web-dev:arm64), linking with Debian's cross gcc (gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross), which also compiles the C inside the broker's TLS crypto provider
# (aws-lc-sys). Why not the rustup toolchain that builds amd64: rustup cannot add a target on
# this machine (no access to its distribution server), and Debian ships the arm64 standard
# library as a package. So each architecture is built by one compiler for both of its binaries:
# amd64 by rustup's stable, arm64 by Debian's rustc-web. Cargo is rustup's, with RUSTC pointing
# at Debian's compiler.
#
# Missing packages are installed (root: dpkg --add-architecture arm64, apt-get install).
# Dependencies are built once into a cache outside the checkout
# (${CREDBROKER_CROSS_CACHE:-~/.cache/credbroker-cross}/target), so a fresh clone rebuilds
# only the workspace's own crates. The binaries: DIR/credbroker and DIR/credbroker-shim
# (default target/cross/arm64), the broker built with --release and the shim with the
# size-optimised `shim` profile, as for amd64, both with cargo-auditable (each carries its
# dependency list). Each is checked to be a static aarch64 ELF.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'scripts/cross-build.sh: %s\n' "$*" >&2; exit 1; }

arch=
out=
while [ $# -gt 0 ]; do
    case "$1" in
        --arch) [ $# -ge 2 ] || die "--arch needs a value"; arch=$2; shift 2 ;;
        --out) [ $# -ge 2 ] || die "--out needs a value"; out=$2; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
case "$arch" in
    arm64) triple=aarch64-unknown-linux-gnu; gnu=aarch64-linux-gnu; machine=AArch64 ;;
    "") die "--arch is required (arm64)" ;;
    *) die "--arch $arch: only arm64 is built (see docs/deploy.md, \"Architectures\")" ;;
esac
out=${out:-target/cross/$arch}
env_triple=$(printf '%s' "$triple" | tr 'a-z-' 'A-Z_')
cc_triple=$(printf '%s' "$triple" | tr '-' '_')

packages=(rustc-web "libstd-rust-web-dev:$arch" "gcc-$gnu" "libc6-dev-$arch-cross")
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "need root to install ${missing[*]}"
    if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
        dpkg --add-architecture "$arch"
    fi
    apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
        || die "cannot install ${missing[*]}"
fi
rustc=/usr/bin/rustc
[ -x "$rustc" ] || die "$rustc (Debian's rustc-web) is missing"
[ -d "/usr/lib/rustlib/$triple" ] || die "/usr/lib/rustlib/$triple is missing: install libstd-rust-web-dev:$arch"

cache=${CREDBROKER_CROSS_CACHE:-$HOME/.cache/credbroker-cross}
mkdir -p "$cache"
[ -f "$cache/CACHEDIR.TAG" ] || printf 'Signature: 8a477f597d28d172789f06886806bc55\n' >"$cache/CACHEDIR.TAG"
export CARGO_TARGET_DIR=$cache/target
export RUSTC=$rustc
export "CARGO_TARGET_${env_triple}_LINKER=$gnu-gcc"
export "CARGO_TARGET_${env_triple}_RUSTFLAGS=-C target-feature=+crt-static"
export "CC_${cc_triple}=$gnu-gcc"
export "AR_${cc_triple}=$gnu-ar"
# Build scripts and proc macros run on this machine: Debian's rustc builds them for amd64 too
# (its amd64 standard library comes with rustc-web), without the amd64 static flag.
printf '== %s: %s for %s\n' "$arch" "$("$rustc" --version)" "$triple" >&2
# cargo-auditable embeds each binary's dependency list (.dep-v0), as for amd64.
cargo auditable --version >/dev/null 2>&1 \
    || die "cargo-auditable is missing: cargo install --locked cargo-auditable (scripts/test.sh does)"
cargo auditable build --locked --target "$triple" --release -p credbroker
cargo auditable build --locked --target "$triple" --profile shim -p credbroker-shim

mkdir -p "$out"
for pair in "release/credbroker:credbroker" "shim/credbroker-shim:credbroker-shim"; do
    src=$CARGO_TARGET_DIR/$triple/${pair%%:*}
    dst=$out/${pair##*:}
    header=$(readelf -h "$src")
    printf '%s\n' "$header" | grep -q "Machine:.*$machine" || die "$src is not an $machine binary"
    if readelf -l "$src" | grep -q INTERP || readelf -d "$src" 2>/dev/null | grep -q NEEDED; then
        die "$src is not static (it has an interpreter or needs shared libraries)"
    fi
    # A name of this run's own: two runs at once (scripts/test.sh's background build and a
    # test's) each replace the file whole, never one another's half-written copy.
    cp "$src" "$dst.partial.$$"
    mv -f "$dst.partial.$$" "$dst"
    printf '%s: %s bytes\n' "$dst" "$(stat -c %s "$dst")"
done
