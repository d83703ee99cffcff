#!/usr/bin/env bash
# Builds the static binaries and lays out the whole root filesystem of the credbroker image:
#
#   OUT/bin/credbroker                      the broker (the sidecar's entrypoint)
#   OUT/plugins/bin/credbroker-shim         the exec plugin (what the manager container runs)
#   OUT/etc/ssl/certs/ca-certificates.crt   CA bundle (the providers' https calls; the system
#                                           store the broker reads)
#   OUT/etc/passwd, OUT/etc/group           root and nonroot (65532), the image's user
#   OUT/usr/share/doc/credbroker/sbom.cdx.json
#                                           the binaries' dependencies at their locked versions
#                                           (CycloneDX, scripts/sbom.sh)
#
# scripts/build-image.sh puts OUT on an empty base (buildah, OCI archive); deploy/Containerfile
# copies OUT onto `scratch` for Docker users: both images hold exactly these files.
# tests/tests/deploy.rs runs this script (with --profile debug, to stay fast) and runs both
# binaries in an empty root; tests/tests/image.rs builds and runs the image.
#
# Usage: scripts/image-content.sh [--arch ARCH] [--profile PROFILE] [--out DIR] [--ca-bundle FILE]
#   --arch amd64        (default) this machine's build (the rustup toolchain).
#   --arch arm64        the binaries of scripts/cross-build.sh --arch arm64 (Debian's rustc
#                       for aarch64; release profiles only).
#   --profile release   (default) broker with --release, shim with --profile shim
#                       (size-optimised); what the image ships.
#   --profile debug     both binaries from the dev profile: a quick build for tests.
#   --profile NAME      both binaries from the Cargo profile NAME.
#   --out DIR           where to lay out the content (default target/image-content).
#                       DIR must be empty, missing, or a previous output of this script.
#   --ca-bundle FILE    PEM CA bundle to ship (default /etc/ssl/certs/ca-certificates.crt,
#                       Debian's ca-certificates).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'scripts/image-content.sh: %s\n' "$*" >&2; exit 1; }

profile=release
arch=amd64
out=target/image-content
ca_bundle=/etc/ssl/certs/ca-certificates.crt
while [ $# -gt 0 ]; do
    case "$1" in
        --arch) [ $# -ge 2 ] || die "--arch needs a value"; arch=$2; shift 2 ;;
        --profile) [ $# -ge 2 ] || die "--profile needs a value"; profile=$2; shift 2 ;;
        --profile=*) profile=${1#--profile=}; shift ;;
        --out) [ $# -ge 2 ] || die "--out needs a value"; out=$2; shift 2 ;;
        --out=*) out=${1#--out=}; shift ;;
        --ca-bundle) [ $# -ge 2 ] || die "--ca-bundle needs a value"; ca_bundle=$2; shift 2 ;;
        --ca-bundle=*) ca_bundle=${1#--ca-bundle=}; shift ;;
        -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[ -n "$profile" ] || die "--profile must not be empty"
[ -n "$out" ] || die "--out must not be empty"
[ -f "$ca_bundle" ] || die "--ca-bundle $ca_bundle is missing (install ca-certificates, or name a PEM bundle)"
grep -q -- '-----BEGIN CERTIFICATE-----' "$ca_bundle" || die "--ca-bundle $ca_bundle holds no PEM certificate"

command -v readelf >/dev/null 2>&1 || die "readelf (binutils) is needed to check that the binaries are static"

# The only files this script ever writes into OUT; anything else there means OUT is not ours.
layout=(bin/credbroker plugins/bin/credbroker-shim etc/ssl/certs/ca-certificates.crt etc/passwd etc/group usr/share/doc/credbroker/sbom.cdx.json)
dirs=(bin plugins plugins/bin etc etc/ssl etc/ssl/certs usr usr/share usr/share/doc usr/share/doc/credbroker)
if [ -e "$out" ]; then
    [ -d "$out" ] || die "--out $out exists and is not a directory"
    ours=()
    for p in "${dirs[@]}" "${layout[@]}"; do ours+=(! -path "./$p"); done
    unexpected=$(cd "$out" && find . -mindepth 1 "${ours[@]}" -print -quit)
    [ -z "$unexpected" ] || die "--out $out holds files this script did not write (e.g. $unexpected); use an empty directory"
fi

cargo=${CARGO:-cargo}
target_dir=${CARGO_TARGET_DIR:-target}
# .cargo/config.toml sets build.target, so outputs land under the target triple.
triple=x86_64-unknown-linux-gnu

# What the release build's paths are mapped to (below): the checkout, its target directory for
# the image, CARGO_HOME. Fixed names, so the binaries do not depend on where they were built.
REMAP_ROOT=/credbroker
REMAP_TARGET=/credbroker/target
REMAP_CARGO_HOME=/cargo

# Cargo calls the dev profile's directory "debug".
profile_dir() { case "$1" in dev|debug) echo debug ;; *) echo "$1" ;; esac; }
profile_flag() { case "$1" in dev|debug) ;; release) echo --release ;; *) echo "--profile $1" ;; esac; }

case "$arch" in
    amd64) ;;
    arm64)
        [ "$profile" = release ] || die "--arch arm64 ships release builds only (--profile release)"
        scripts/cross-build.sh --arch arm64 --out target/cross/arm64 >&2
        ;;
    *) die "--arch $arch: amd64 or arm64" ;;
esac

case "$arch:$profile" in
    arm64:*)
        broker_src=target/cross/arm64/credbroker
        shim_src=target/cross/arm64/credbroker-shim
        ;;
    *:release)
        # What ships carries its dependency list (cargo-auditable's .dep-v0 section).
        "$cargo" auditable --version >/dev/null 2>&1 \
            || die "cargo-auditable is missing: cargo install --locked cargo-auditable (scripts/test.sh does)"
        # Where the sources and the build sit must not show in what ships: panic locations,
        # prost's generated code (in OUT_DIR) and the C of the TLS crypto provider (__FILE__)
        # name them. Mapped to fixed names, a build in a clone anywhere, with any CARGO_HOME
        # (deploy/Containerfile: /src, /usr/local/cargo) gives the same bytes.
        # Its own target directory: other rustflags than every other build's (test.sh's shim,
        # tests/tests/sbom.rs), which would otherwise rebuild each other's crates in turn.
        image_target=$target_dir/image-build
        mkdir -p "$image_target"
        image_target=$(cd "$image_target" && pwd -P)
        root=$(pwd -P)
        cargo_home=${CARGO_HOME:-$HOME/.cargo}
        cargo_home=$(cd "$cargo_home" && pwd -P)
        remap=("--remap-path-prefix=$root=$REMAP_ROOT" "--remap-path-prefix=$image_target=$REMAP_TARGET"
               "--remap-path-prefix=$cargo_home=$REMAP_CARGO_HOME")
        rustflags=$(printf '"%s",' "${remap[@]}")
        cflags="-ffile-prefix-map=$root=$REMAP_ROOT -ffile-prefix-map=$image_target=$REMAP_TARGET -ffile-prefix-map=$cargo_home=$REMAP_CARGO_HOME"
        # --config appends these to .cargo/config.toml's target rustflags (+crt-static stays).
        for build in "--release -p credbroker" "--profile shim -p credbroker-shim"; do
            # shellcheck disable=SC2086
            CARGO_TARGET_DIR=$image_target CFLAGS_x86_64_unknown_linux_gnu="${CFLAGS_x86_64_unknown_linux_gnu:-} $cflags" \
                "$cargo" auditable build --locked $build \
                --config "target.$triple.rustflags=[${rustflags%,}]"
        done
        broker_src=$image_target/$triple/release/credbroker
        shim_src=$image_target/$triple/shim/credbroker-shim
        ;;
    *:*)
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

mkdir -p "$out/bin" "$out/plugins/bin" "$out/etc/ssl/certs"
install -m 0755 "$broker_src" "$out/${layout[0]}"
install -m 0755 "$shim_src" "$out/${layout[1]}"
install -m 0644 "$ca_bundle" "$out/${layout[2]}"
# 65532 "nonroot": distroless's user, and Kueue's manager image's (USER 65532:65532), so the
# socket's owner has a name in both containers. No shell: nobody logs in.
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$out/${layout[3]}"
printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$out/${layout[4]}"
chmod 0644 "$out/${layout[3]}" "$out/${layout[4]}"
case "$arch" in arm64) sbom_target=aarch64-unknown-linux-gnu ;; *) sbom_target=$triple ;; esac
mkdir -p "$out/usr/share/doc/credbroker"
scripts/sbom.sh --target "$sbom_target" --out "$out/${layout[5]}"
chmod 0644 "$out/${layout[5]}"
printf '%s\n' "${layout[@]/#/$out/}"
