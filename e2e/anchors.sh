#!/usr/bin/env bash
# Builds the bench's anchors (BENCHMARKS.md, section "anchors"): the exec plugins users would run
# instead of credbroker, from the Go module proxy at pinned versions, and e2e/cmd/fleet (the
# client-go fleet the bench times), once per version, into the cache e2e/peers.sh uses:
# ${CREDBROKER_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/credbroker-e2e}/<name>-<version>/.
# What is built is skipped. Each build is CGO_ENABLED=0, GOTOOLCHAIN=local. Writes
# $cache/anchors.env (KEY=path lines) for credbroker-bench. Fails loudly if one cannot be built.
# bench/run.sh runs it; the CI smoke run does not (it measures only what is already built).
set -euo pipefail

AIA_VERSION=v0.7.13        # sigs.k8s.io/aws-iam-authenticator: `token -i CLUSTER [-r ROLE]`
# github.com/Azure/kubelogin: v0.2.22 is the newest the proxy serves, but its go.mod says
# `go 1.26.10` and the local toolchain is go1.26.8 (GOTOOLCHAIN=local: no toolchain download);
# v0.2.21 (`go 1.26.6`) is the newest this toolchain builds.
KUBELOGIN_VERSION=v0.2.21
# cluster-inventory-api's secretreader: the version e2e/peers.sh pins (one pin, one recipe).
CIA_VERSION=$(sed -n 's/^CIA_VERSION=\([^[:space:]]*\).*/\1/p' "$(dirname "$0")/peers.sh")
# gke-gcloud-auth-plugin (k8s.io/cloud-provider-gcp) is not built: the proxy refuses that module
# (403 for its version list, @latest and the pseudo-versions of its release commits; its v36.x
# tags are not versions of a module path without /v36). The bench takes the Debian package's
# binary (google-cloud-cli-gke-gcloud-auth-plugin) when it is installed.
GKE_PLUGIN=/usr/bin/gke-gcloud-auth-plugin

e2e=$(cd "$(dirname "$0")" && pwd)
cache=${CREDBROKER_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/credbroker-e2e}
export CGO_ENABLED=0 GOTOOLCHAIN=local
die() { printf 'e2e/anchors.sh: %s\n' "$*" >&2; exit 1; }
command -v go >/dev/null || die "go is missing (the Go toolchain builds the anchors)"
[ -n "$CIA_VERSION" ] || die "no CIA_VERSION in e2e/peers.sh"
mkdir -p "$cache"
# shellcheck source=e2e/gowrap.sh
. "$e2e/gowrap.sh"

# Built with its own `no_server` tag (the binary without the `server` subcommand, which is the
# authenticator's webhook server, not the client users run): server.go imports
# k8s.io/sample-controller v0.36.0-rc.0, whose zip the proxy refuses (403). `token` is unchanged.
aia=$cache/aws-iam-authenticator-$AIA_VERSION/aws-iam-authenticator
if [ ! -x "$aia" ]; then
    wrap_build "$cache" aws-iam-authenticator sigs.k8s.io/aws-iam-authenticator "$AIA_VERSION" \
        sigs.k8s.io/aws-iam-authenticator/cmd/aws-iam-authenticator "$aia" -tags no_server \
        -ldflags "-s -w -X sigs.k8s.io/aws-iam-authenticator/pkg.Version=$AIA_VERSION" \
        || die "aws-iam-authenticator $AIA_VERSION did not build"
fi

kubelogin=$cache/kubelogin-$KUBELOGIN_VERSION/kubelogin
if [ ! -x "$kubelogin" ]; then
    wrap_build "$cache" kubelogin github.com/Azure/kubelogin "$KUBELOGIN_VERSION" \
        github.com/Azure/kubelogin "$kubelogin" -ldflags "-s -w -X main.gitTag=$KUBELOGIN_VERSION" \
        || die "kubelogin $KUBELOGIN_VERSION did not build"
fi

# The same binary and directory e2e/peers.sh builds (gowrap.sh's recipe, the same pin).
secretreader=$cache/secretreader-$CIA_VERSION/secretreader
if [ ! -x "$secretreader" ]; then
    wrap_build "$cache" secretreader sigs.k8s.io/cluster-inventory-api "$CIA_VERSION" \
        sigs.k8s.io/cluster-inventory-api/plugins/secretreader/cmd/plugin "$secretreader" -ldflags "-s -w" \
        || die "secretreader $CIA_VERSION did not build"
fi

# e2e/cmd/fleet, versioned by the content of its source and of the e2e module's go.mod/go.sum.
fleet_version=$(cat "$e2e/go.mod" "$e2e/go.sum" "$e2e"/cmd/fleet/*.go | sha256sum | cut -c1-12)
fleet=$cache/fleet-$fleet_version/fleet
if [ ! -x "$fleet" ]; then
    mkdir -p "$(dirname "$fleet")"
    (cd "$e2e" && nice -n 10 go build -trimpath -ldflags "-s -w" -o "$fleet.tmp" ./cmd/fleet) \
        || die "e2e/cmd/fleet did not build"
    mv "$fleet.tmp" "$fleet"
fi

{
    echo "AWS_IAM_AUTHENTICATOR=$aia"
    echo "AWS_IAM_AUTHENTICATOR_VERSION=$AIA_VERSION"
    echo "KUBELOGIN=$kubelogin"
    echo "KUBELOGIN_VERSION=$KUBELOGIN_VERSION"
    echo "SECRETREADER=$secretreader"
    echo "SECRETREADER_VERSION=$CIA_VERSION"
    echo "FLEET=$fleet"
    if [ -x "$GKE_PLUGIN" ]; then echo "GKE_GCLOUD_AUTH_PLUGIN=$GKE_PLUGIN"; fi
} > "$cache/anchors.env.tmp"
mv "$cache/anchors.env.tmp" "$cache/anchors.env"
for f in "$aia" "$kubelogin" "$secretreader" "$fleet"; do
    [ -x "$f" ] || die "$f is missing after the build"
done
printf 'anchors in %s:\n' "$cache" >&2; sed 's/^/  /' "$cache/anchors.env" >&2
