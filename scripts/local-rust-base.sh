#!/usr/bin/env bash
# Builds (once) and caches a local stand-in for deploy/Containerfile's build base,
# docker.io/library/rust:1-bookworm, for machines that reach no container registry (CI here):
#
#   - Debian 12 "bookworm", as that image, from Debian's own mirrors (mmdebstrap, minbase):
#     bookworm, bookworm-updates and bookworm-security, with the part of buildpack-deps:bookworm
#     (the official image's base) a Rust build touches: gcc, g++, libc6-dev, make, git, curl,
#     ca-certificates, pkg-config, libssl-dev, ... Like the official image it has neither jq
#     nor cargo-auditable: deploy/Containerfile installs those itself.
#   - Rust stable, laid out as the official image lays it out (RUSTUP_HOME=/usr/local/rustup,
#     CARGO_HOME=/usr/local/cargo, PATH=/usr/local/cargo/bin:..., RUST_VERSION): this machine's
#     rustup toolchain (`rustup default`, rustc/cargo/std; its HTML docs left out) and rustup
#     itself, copied in. Not rustup-init: rustup's download server is out of reach here. Not
#     Debian's rustc-web (1.96, new enough for the workspace's rust-version and edition): the
#     image this base builds is compared file for file with scripts/build-image.sh's, whose
#     binaries this machine's toolchain builds, so both must come from one compiler.
#
# The image is an OCI layout cached by what it holds: Debian's release, the toolchain's
# `rustc -V` and this script's digest, under ${CREDBROKER_IMAGE_CACHE:-~/.cache/credbroker-image}.
# A second run with the same key builds nothing and prints the same reference; a build is
# written to a temporary directory and renamed into place only once complete.
#
# Usage: scripts/local-rust-base.sh      prints the base's reference for buildah, e.g.
#   oci:/root/.cache/credbroker-image/rust-base-bookworm-1.95.0-0123abcd:rust
# then: buildah build --build-arg RUST_IMAGE=<that> -f deploy/Containerfile .
# Needs root, mmdebstrap and buildah (installed with apt-get when missing), and rustup.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'scripts/local-rust-base.sh: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) die "unknown argument: $1 (see --help)" ;;
esac
[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap, buildah)"

# The official image's Debian release (its tag) and where Debian's packages come from.
suite=bookworm
mirror=http://deb.debian.org/debian
security=http://deb.debian.org/debian-security
# What a Rust build may reach for in buildpack-deps:bookworm (its curl, scm and build layers),
# without the image libraries it also carries. No jq, no cargo-auditable: not in that image.
packages=(ca-certificates curl wget gnupg netbase git openssh-client procps
          autoconf automake dpkg-dev file gcc g++ libc6-dev make patch pkg-config
          libssl-dev zlib1g-dev unzip xz-utils)

missing=()
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
        || die "cannot install ${missing[*]}"
fi
command -v rustup >/dev/null 2>&1 || die "rustup is missing: the base copies its default toolchain"

toolchain_dir=$(rustup run "$(rustup default | awk '{print $1}')" rustc --print sysroot) \
    || die "rustup's default toolchain does not run rustc"
rustc_version=$("$toolchain_dir/bin/rustc" -V | awk '{print $2}')
[[ "$rustc_version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "rustup's default toolchain is not a stable release: $("$toolchain_dir/bin/rustc" -V)"
host=$("$toolchain_dir/bin/rustc" -vV | sed -n 's/^host: //p')
rustup_bin=$(command -v rustup)
script_digest=$(sha256sum "$0" | cut -c1-8)

cache=${CREDBROKER_IMAGE_CACHE:-$HOME/.cache/credbroker-image}
name=rust-base-$suite-$rustc_version-$script_digest
layout=$cache/$name
ref=oci:$layout:rust
mkdir -p "$cache"
[ -f "$cache/CACHEDIR.TAG" ] || printf 'Signature: 8a477f597d28d172789f06886806bc55\n' >"$cache/CACHEDIR.TAG"

# One builder at a time (two test processes may ask at once); the second finds it built.
exec 9>"$cache/$name.lock"
flock 9
if [ -f "$layout/index.json" ]; then
    printf '%s\n' "$ref"
    exit 0
fi

work=$(mktemp -d "$cache/.build-$name.XXXXXX")
storage=$work/storage
bh() { buildah --root "$storage/root" --runroot "$storage/runroot" --storage-driver vfs "$@"; }
cleanup() {
    if [ -n "${ctr:-}" ]; then bh umount "$ctr" >/dev/null 2>&1 || true; bh rm "$ctr" >/dev/null 2>&1 || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

printf 'scripts/local-rust-base.sh: building %s (Debian %s, Rust %s)\n' "$name" "$suite" "$rustc_version" >&2
rootfs=$work/rootfs
include=$(IFS=,; printf '%s' "${packages[*]}")
mmdebstrap --quiet --variant=minbase --include="$include" \
    --aptopt='Acquire::Retries "3"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    "$suite" "$rootfs" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main" \
    >&2 || die "mmdebstrap $suite failed"

# Rust, where the official image has it. The toolchain's name is its version, as there
# (rustup-init --default-toolchain $RUST_VERSION); the proxies are copies of rustup.
tc=$rustc_version-$host
mkdir -p "$rootfs/usr/local/rustup/toolchains/$tc" "$rootfs/usr/local/cargo/bin"
tar -C "$toolchain_dir" --exclude=./share/doc -cf - . | tar -C "$rootfs/usr/local/rustup/toolchains/$tc" -xf -
printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\n' "$tc" >"$rootfs/usr/local/rustup/settings.toml"
install -m 0755 "$rustup_bin" "$rootfs/usr/local/cargo/bin/rustup"
for proxy in cargo rustc rustdoc rust-gdb rust-gdbgui rust-lldb; do
    ln "$rootfs/usr/local/cargo/bin/rustup" "$rootfs/usr/local/cargo/bin/$proxy"
done
chmod -R a+w "$rootfs/usr/local/rustup" "$rootfs/usr/local/cargo"

ctr=$(bh from --quiet scratch)
mnt=$(bh mount "$ctr")
tar -C "$rootfs" -cf - . | tar -C "$mnt" -xf -
bh umount "$ctr" >/dev/null
bh config --os linux --arch amd64 \
    --env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
    --env PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env "RUST_VERSION=$rustc_version" \
    --cmd '["bash"]' \
    --label "org.opencontainers.image.description=local stand-in for docker.io/library/rust:1-$suite" \
    "$ctr"
bh commit --quiet --format oci --rm "$ctr" "oci:$work/image:rust" >/dev/null
ctr=
mv "$work/image" "$layout"
# Older bases (another toolchain or script) are dropped: the cache holds the current key.
for old in "$cache"/rust-base-*; do
    case "$old" in "$layout"|"$layout.lock") ;; *) rm -rf "$old" ;; esac
done
printf '%s\n' "$ref"
