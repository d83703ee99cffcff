#!/usr/bin/env bash
# Writes the software bill of materials of the two shipped binaries, credbroker and
# credbroker-shim, as CycloneDX 1.5 JSON: every crate their normal dependency graph reaches
# for one target, at the version Cargo.lock pins (`cargo metadata --locked`), with its
# package URL (pkg:cargo/NAME@VERSION) and license. Build and dev dependencies are not in the
# binaries and are left out. No timestamp and no random serial number: the same commit gives
# the same file, so the image that carries it stays reproducible.
#
# Usage: scripts/sbom.sh [--target TRIPLE] [--out FILE]
#   --target TRIPLE   default x86_64-unknown-linux-gnu (aarch64-unknown-linux-gnu for arm64)
#   --out FILE        default stdout
#
# The image carries it at /usr/share/doc/credbroker/sbom.cdx.json (scripts/image-content.sh);
# each binary also carries its own dependency list (cargo-auditable's .dep-v0 section).
# Needs cargo and jq.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'scripts/sbom.sh: %s\n' "$*" >&2; exit 1; }

target=x86_64-unknown-linux-gnu
out=
while [ $# -gt 0 ]; do
    case "$1" in
        --target) [ $# -ge 2 ] || die "--target needs a value"; target=$2; shift 2 ;;
        --out) [ $# -ge 2 ] || die "--out needs a value"; out=$2; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
command -v jq >/dev/null 2>&1 || die "jq is missing: apt-get install jq (scripts/test.sh does)"

metadata=$(cargo metadata --locked --format-version 1 --filter-platform "$target")
sbom=$(jq --arg target "$target" '
  . as $m
  | ($m.packages | map({key: .id, value: .}) | from_entries) as $pkg
  # Normal dependency edges only: what is linked into the binaries.
  | ($m.resolve.nodes
      | map({key: .id, value: [.deps[] | select(any(.dep_kinds[]; .kind == null)) | .pkg]})
      | from_entries) as $edges
  | [$m.packages[] | select(.source == null and (.name == "credbroker" or .name == "credbroker-shim")) | .id] as $roots
  | ({seen: {}, todo: $roots}
      | until(.todo | length == 0;
          .todo[0] as $x
          | .todo |= .[1:]
          | if .seen[$x] then . else .seen[$x] = true | .todo += $edges[$x] end)
      | .seen | keys) as $reached
  | def component($p): {
        type: (if $p.source == null then "application" else "library" end),
        "bom-ref": ("pkg:cargo/" + $p.name + "@" + $p.version),
        name: $p.name,
        version: $p.version,
        purl: ("pkg:cargo/" + $p.name + "@" + $p.version),
      } + (if $p.license then {licenses: [{expression: $p.license}]} else {} end);
    {
      bomFormat: "CycloneDX",
      specVersion: "1.5",
      version: 1,
      metadata: {
        component: {type: "application", name: "credbroker", version: $pkg[$roots[0]].version,
                    "bom-ref": "credbroker", properties: [{name: "target", value: $target}]}
      },
      components: ([$reached[] | $pkg[.] | component(.)] | sort_by(.name, .version)),
      dependencies: ([$reached[] | {ref: ("pkg:cargo/" + $pkg[.].name + "@" + $pkg[.].version),
                                    dependsOn: ([$edges[.][] | "pkg:cargo/" + $pkg[.].name + "@" + $pkg[.].version] | unique)}]
                     | sort_by(.ref))
    }' <<<"$metadata")
if [ -n "$out" ]; then
    mkdir -p "$(dirname "$out")"
    printf '%s\n' "$sbom" >"$out.partial.$$"
    mv -f "$out.partial.$$" "$out"
else
    printf '%s\n' "$sbom"
fi
