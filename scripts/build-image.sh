#!/usr/bin/env bash
# Builds the credbroker image as an OCI archive with buildah: no daemon, no registry, no base
# image. The image is scripts/image-content.sh's output on an empty base (`buildah from
# scratch`), configured like deploy/Containerfile's default target:
#
#   /bin/credbroker, /plugins/bin/credbroker-shim, /etc/ssl/certs/ca-certificates.crt,
#   /etc/passwd and /etc/group (nonroot = 65532); user 65532:65532, entrypoint /bin/credbroker,
#   cmd `serve --config /etc/credbroker/config.yaml`, linux/ARCH, the PATH every Containerfile
#   build gets (docker build, buildah build), and the OCI labels
#   org.opencontainers.image.source (Cargo.toml's repository), .version (the broker's own
#   `credbroker version`) and .revision (git HEAD).
#
# Push it with skopeo (docs/deploy.md, section 1):
#   skopeo copy oci-archive:target/credbroker-image.tar docker://REGISTRY/credbroker:TAG
#
# Usage: scripts/build-image.sh [--arch ARCH] [--profile PROFILE] [--content DIR] [--out FILE]
#                               [--tag NAME:TAG] [--revision REV] [--timestamp SECONDS]
#   --arch ARCH         amd64 (default) or arm64, passed to scripts/image-content.sh and
#                       written into the image's config
#   --profile PROFILE   passed to scripts/image-content.sh (default release)
#   --content DIR       use DIR, an existing output of scripts/image-content.sh, instead of
#                       running it (the tests reuse their debug build this way)
#   --out FILE          the OCI archive to write (default target/credbroker-image.tar); replaced
#                       only once the new archive is complete
#   --tag NAME:TAG      the reference stored in the archive (default credbroker:VERSION)
#   --revision REV      org.opencontainers.image.revision (default `git rev-parse HEAD`)
#   --timestamp SECONDS the image's creation time and every file's mtime in its layer
#                       (default SOURCE_DATE_EPOCH, else the commit's time): two builds of
#                       one commit give the same layer and config digests
#
# buildah's storage is a fresh temporary directory (vfs driver, which needs no overlay mount),
# removed on exit: nothing is left in /var/lib/containers. Needs root (buildah, Debian package;
# scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'scripts/build-image.sh: %s\n' "$*" >&2; exit 1; }

profile=release
arch=amd64
timestamp=
content=
out=target/credbroker-image.tar
tag=
revision=
while [ $# -gt 0 ]; do
    case "$1" in
        --arch|--profile|--content|--out|--tag|--revision|--timestamp)
            [ $# -ge 2 ] || die "$1 needs a value"
            case "$1" in
                --arch) arch=$2 ;; --profile) profile=$2 ;; --content) content=$2 ;;
                --out) out=$2 ;; --tag) tag=$2 ;; --revision) revision=$2 ;;
                --timestamp) timestamp=$2 ;;
            esac
            shift 2 ;;
        -h|--help) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[ -n "$out" ] || die "--out must not be empty"
case "$arch" in amd64|arm64) ;; *) die "--arch $arch: amd64 or arm64" ;; esac
command -v buildah >/dev/null 2>&1 || die "buildah is missing: apt-get install buildah (scripts/test.sh does)"

if [ -z "$content" ]; then
    content=target/image-content-$arch
    scripts/image-content.sh --arch "$arch" --profile "$profile" --out "$content" >/dev/null
fi
for f in bin/credbroker plugins/bin/credbroker-shim etc/ssl/certs/ca-certificates.crt etc/passwd etc/group usr/share/doc/credbroker/sbom.cdx.json; do
    [ -f "$content/$f" ] || die "--content $content lacks $f: is it an output of scripts/image-content.sh?"
done

# The broker says its own version, so the label cannot drift from the binary (an arm64 one
# says it under qemu-user).
run_broker=("$content/bin/credbroker")
if [ "$arch" = arm64 ]; then
    command -v qemu-aarch64-static >/dev/null 2>&1 || die "qemu-aarch64-static (qemu-user-static) is needed to ask the arm64 broker its version"
    run_broker=(qemu-aarch64-static "$content/bin/credbroker")
fi
version=$("${run_broker[@]}" version | awk '$1 == "credbroker" {print $2; exit}')
[ -n "$version" ] || die "$content/bin/credbroker version printed no version"
source_url=$(sed -n 's/^repository *= *"\(.*\)"$/\1/p' Cargo.toml | head -1)
[ -n "$source_url" ] || die "no repository = \"...\" in Cargo.toml's [workspace.package]"
if [ -z "$revision" ]; then
    revision=$(git rev-parse HEAD 2>/dev/null) || die "not a git checkout: pass --revision"
fi
[ -n "$tag" ] || tag=credbroker:$version
if [ -z "$timestamp" ]; then
    timestamp=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null)} || true
fi
[[ "$timestamp" =~ ^[0-9]+$ ]] || die "--timestamp must be seconds since the epoch (or set SOURCE_DATE_EPOCH), got ${timestamp:-nothing}"

storage=$(mktemp -d "${TMPDIR:-/tmp}/credbroker-buildah.XXXXXX")
bh() { buildah --root "$storage/root" --runroot "$storage/runroot" --storage-driver vfs "$@"; }
cleanup() {
    if [ -n "${ctr:-}" ]; then bh rm "$ctr" >/dev/null 2>&1 || true; fi
    rm -rf "$storage"
    if [ -n "${partial:-}" ]; then rm -f "$partial"; fi
}
trap cleanup EXIT

ctr=$(bh from --quiet scratch)
bh copy --quiet --chown 0:0 "$ctr" "$content/" / >/dev/null
bh config \
    --os linux --arch "$arch" \
    --user 65532:65532 \
    --workingdir / \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --entrypoint '["/bin/credbroker"]' \
    --cmd '["serve", "--config", "/etc/credbroker/config.yaml"]' \
    --label "org.opencontainers.image.source=$source_url" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$revision" \
    --label "org.opencontainers.image.title=credbroker" \
    "$ctr"

mkdir -p "$(dirname "$out")"
partial=$out.partial.$$
rm -f "$partial"
bh commit --quiet --format oci --timestamp "$timestamp" --rm "$ctr" "oci-archive:$partial:$tag" >/dev/null
ctr=
mv -f "$partial" "$out"
printf '%s\n' "$out"
