#!/usr/bin/env bash
# Builds the static binaries and lays out the content of the credbroker container image:
#
#   OUT/bin/credbroker                  the broker (the sidecar's entrypoint)
#   OUT/plugins/bin/credbroker-shim     the exec plugin (what the manager container runs)
#
# deploy/Containerfile copies OUT onto a distroless/static base, so this script is the
# whole build: what it checks here (static, right paths) is what the image holds.
# tests/tests/deploy.rs runs it (with --profile debug, to stay fast) and runs both
# binaries in an empty root.
#
# Usage: scripts/image-content.sh [--profile PROFILE] [--out DIR]
#   --profile release   (default) broker with --release, shim with --profile shim
#                       (size-optimised); what the image ships.
#   --profile debug     both binaries from the dev profile: a quick build for tests.
#   --profile NAME      both binaries from the Cargo profile NAME.
#   --out DIR           where to lay out the content (default target/image-content).
#                       DIR must be empty, missing, or a previous output of this script.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'scripts/image-content.sh: %s\n' "$*" >&2; exit 1; }

profile=release
out=target/image-content
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) [ $# -ge 2 ] || die "--profile needs a value"; profile=$2; shift 2 ;;
        --profile=*) profile=${1#--profile=}; shift ;;
        --out) [ $# -ge 2 ] || die "--out needs a value"; out=$2; shift 2 ;;
        --out=*) out=${1#--out=}; shift ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[ -n "$profile" ] || die "--profile must not be empty"
[ -n "$out" ] || die "--out must not be empty"

command -v readelf >/dev/null 2>&1 || die "readelf (binutils) is needed to check that the binaries are static"

# The only files this script ever writes into OUT; anything else there means OUT is not ours.
layout=(bin/credbroker plugins/bin/credbroker-shim)
if [ -e "$out" ]; then
    [ -d "$out" ] || die "--out $out exists and is not a directory"
    unexpected=$(cd "$out" && find . -mindepth 1 \
        ! -path ./bin ! -path ./plugins ! -path ./plugins/bin \
        ! -path ./bin/credbroker ! -path ./plugins/bin/credbroker-shim -print -quit)
    [ -z "$unexpected" ] || die "--out $out holds files this script did not write (e.g. $unexpected); use an empty directory"
fi

cargo=${CARGO:-cargo}
target_dir=${CARGO_TARGET_DIR:-target}
# .cargo/config.toml sets build.target, so outputs land under the target triple.
triple=x86_64-unknown-linux-gnu

# Cargo calls the dev profile's directory "debug".
profile_dir() { case "$1" in dev|debug) echo debug ;; *) echo "$1" ;; esac; }
profile_flag() { case "$1" in dev|debug) ;; release) echo --release ;; *) echo "--profile $1" ;; esac; }

case "$profile" in
    release)
        "$cargo" build --locked --release -p credbroker
        "$cargo" build --locked --profile shim -p credbroker-shim
        broker_src=$target_dir/$triple/release/credbroker
        shim_src=$target_dir/$triple/shim/credbroker-shim
        ;;
    *)
        # shellcheck disable=SC2046
        "$cargo" build --locked $(profile_flag "$profile") -p credbroker -p credbroker-shim
        broker_src=$target_dir/$triple/$(profile_dir "$profile")/credbroker
        shim_src=$target_dir/$triple/$(profile_dir "$profile")/credbroker-shim
        ;;
esac

for src in "$broker_src" "$shim_src"; do
    [ -x "$src" ] || die "cargo build succeeded but $src is missing"
    headers=$(readelf -lW "$src") || die "readelf -lW $src failed"
    if grep -q INTERP <<<"$headers"; then
        die "$src is dynamically linked (it has a PT_INTERP header); the image has no libc. Is +crt-static set in .cargo/config.toml?"
    fi
done

mkdir -p "$out/bin" "$out/plugins/bin"
install -m 0755 "$broker_src" "$out/${layout[0]}"
install -m 0755 "$shim_src" "$out/${layout[1]}"
printf '%s\n' "${layout[@]/#/$out/}"
