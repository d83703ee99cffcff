#!/usr/bin/env bash
# Builds the credbroker image for linux/amd64 and linux/arm64 and joins them in one OCI image
# index (a multi-arch "manifest list"), written as an OCI archive: a node pulls the image of
# its own architecture by the one tag. Each image is scripts/build-image.sh's, with the same
# timestamp, so the index of one commit is the same whenever it is built.
#
# Push the index and both images with skopeo (docs/deploy.md, section 1):
#   skopeo copy --all oci-archive:target/credbroker-image-index.tar docker://REGISTRY/credbroker:TAG
#
# Usage: scripts/build-image-index.sh [--out FILE] [--tag NAME:TAG] [--revision REV]
#                                     [--timestamp SECONDS] [--content-amd64 DIR] [--content-arm64 DIR]
#   --out FILE            the index archive (default target/credbroker-image-index.tar),
#                         replaced only once complete
#   --tag NAME:TAG        the reference stored in it (default credbroker:VERSION)
#   --revision, --timestamp   passed to scripts/build-image.sh for both images
#   --content-ARCH DIR    an existing scripts/image-content.sh output for ARCH (tests)
#
# Needs root, buildah and skopeo, and for arm64 what scripts/cross-build.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'scripts/build-image-index.sh: %s\n' "$*" >&2; exit 1; }

out=target/credbroker-image-index.tar
tag=
common=()
declare -A content=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out|--tag|--revision|--timestamp|--content-amd64|--content-arm64)
            [ $# -ge 2 ] || die "$1 needs a value"
            case "$1" in
                --out) out=$2 ;; --tag) tag=$2 ;;
                --revision|--timestamp) common+=("$1" "$2") ;;
                --content-amd64) content[amd64]=$2 ;; --content-arm64) content[arm64]=$2 ;;
            esac
            shift 2 ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
command -v buildah >/dev/null 2>&1 || die "buildah is missing: apt-get install buildah (scripts/test.sh does)"

work=$(mktemp -d "${TMPDIR:-/tmp}/credbroker-index.XXXXXX")
bh() { buildah --root "$work/root" --runroot "$work/runroot" --storage-driver vfs "$@"; }
cleanup() { rm -rf "$work"; if [ -n "${partial:-}" ]; then rm -f "$partial"; fi; }
trap cleanup EXIT

images=()
for arch in amd64 arm64; do
    args=(--arch "$arch" --out "$work/$arch.tar" "${common[@]}")
    if [ -n "${content[$arch]:-}" ]; then args+=(--content "${content[$arch]}"); fi
    if [ -n "$tag" ]; then args+=(--tag "$tag"); fi
    scripts/build-image.sh "${args[@]}" >/dev/null
    images+=("$work/$arch.tar")
done
# The tag both images were stored under (build-image.sh's default names the version).
[ -n "$tag" ] || tag=$(tar -xOf "$work/amd64.tar" index.json \
    | sed -n 's/.*"org.opencontainers.image.ref.name":"\([^"]*\)".*/\1/p')
[ -n "$tag" ] || die "cannot read the images' tag"

bh manifest create credbroker-index >/dev/null
for image in "${images[@]}"; do
    bh manifest add credbroker-index "oci-archive:$image" >/dev/null
done
mkdir -p "$(dirname "$out")"
partial=$out.partial.$$
rm -f "$partial"
bh manifest push --all --format oci credbroker-index "oci-archive:$partial:$tag" >/dev/null
mv -f "$partial" "$out"
partial=
printf '%s\n' "$out"
