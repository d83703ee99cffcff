#!/usr/bin/env bash
# Builds the credbroker image as an OCI archive with buildah: no daemon, no registry, no base
# image. The image is scripts/image-content.sh's output on an empty base (`buildah from
# scratch`), configured like deploy/Containerfile's default target:
#
#   /bin/credbroker, /plugins/bin/credbroker-shim, /etc/ssl/certs/ca-certificates.crt,
#   /etc/passwd and /etc/group (nonroot = 65532); user 65532:65532, entrypoint /bin/credbroker,
#   cmd `serve --config /etc/credbroker/config.yaml`, linux/amd64, and the OCI labels
#   org.opencontainers.image.source (Cargo.toml's repository), .version (the broker's own
#   `credbroker version`) and .revision (git HEAD).
#
# Push it with skopeo (docs/deploy.md, section 1):
#   skopeo copy oci-archive:target/credbroker-image.tar docker://REGISTRY/credbroker:TAG
#
# Usage: scripts/build-image.sh [--profile PROFILE] [--content DIR] [--out FILE] [--tag NAME:TAG]
#                               [--revision REV]
#   --profile PROFILE   passed to scripts/image-content.sh (default release)
#   --content DIR       use DIR, an existing output of scripts/image-content.sh, instead of
#                       running it (the tests reuse their debug build this way)
#   --out FILE          the OCI archive to write (default target/credbroker-image.tar); replaced
#                       only once the new archive is complete
#   --tag NAME:TAG      the reference stored in the archive (default credbroker:VERSION)
#   --revision REV      org.opencontainers.image.revision (default `git rev-parse HEAD`)
#
# buildah's storage is a fresh temporary directory (vfs driver, which needs no overlay mount),
# removed on exit: nothing is left in /var/lib/containers. Needs root (buildah, Debian package;
# scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'scripts/build-image.sh: %s\n' "$*" >&2; exit 1; }

profile=release
content=
out=target/credbroker-image.tar
tag=
revision=
while [ $# -gt 0 ]; do
    case "$1" in
        --profile|--content|--out|--tag|--revision)
            [ $# -ge 2 ] || die "$1 needs a value"
            case "$1" in
                --profile) profile=$2 ;; --content) content=$2 ;; --out) out=$2 ;;
                --tag) tag=$2 ;; --revision) revision=$2 ;;
            esac
            shift 2 ;;
        -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[ -n "$out" ] || die "--out must not be empty"
command -v buildah >/dev/null 2>&1 || die "buildah is missing: apt-get install buildah (scripts/test.sh does)"

if [ -z "$content" ]; then
    content=target/image-content
    scripts/image-content.sh --profile "$profile" --out "$content" >/dev/null
fi
for f in bin/credbroker plugins/bin/credbroker-shim etc/ssl/certs/ca-certificates.crt etc/passwd etc/group; do
    [ -f "$content/$f" ] || die "--content $content lacks $f: is it an output of scripts/image-content.sh?"
done

# The broker says its own version, so the label cannot drift from the binary.
version=$("$content/bin/credbroker" version | awk '$1 == "credbroker" {print $2; exit}')
[ -n "$version" ] || die "$content/bin/credbroker version printed no version"
source_url=$(sed -n 's/^repository *= *"\(.*\)"$/\1/p' Cargo.toml | head -1)
[ -n "$source_url" ] || die "no repository = \"...\" in Cargo.toml's [workspace.package]"
if [ -z "$revision" ]; then
    revision=$(git rev-parse HEAD 2>/dev/null) || die "not a git checkout: pass --revision"
fi
[ -n "$tag" ] || tag=credbroker:$version

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
    --os linux --arch amd64 \
    --user 65532:65532 \
    --workingdir / \
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
bh commit --quiet --format oci --rm "$ctr" "oci-archive:$partial:$tag" >/dev/null
ctr=
mv -f "$partial" "$out"
printf '%s\n' "$out"
