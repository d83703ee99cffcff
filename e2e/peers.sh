#!/usr/bin/env bash
# Builds the real-cluster suite's test peers from the Go module proxy, once per version, into a
# cache that survives between runs: ${CREDBROKER_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/credbroker-e2e}.
# A peer whose binary for that version is already there is skipped. Each build is CGO_ENABLED=0,
# GOTOOLCHAIN=local. Writes $cache/peers.env (KEY=path lines) for the Go tests. Fails loudly if a
# peer cannot be built. Nothing here is committed: the wrapper modules live in the cache too.
#
# e2e/peers.sh [PART...]: all of it, or only the parts named, so that CI builds them beside
# its other work (scripts/test.sh) and waits for a part only where a test needs it:
#   env      fetches the manifests' modules and writes peers.env (seconds; what the deploy and
#            docs tests read); the binaries it names may still be building
#   kueue    builds Kueue (each of KUEUE_VERSIONS; tests/tests/deploy.rs starts it)
#   cluster  builds kube-apiserver, etcd, the node's binaries, containerd, crane, secretreader
# Parts named together run in that order; with no part named, env, kueue and cluster run in
# order and the binaries are checked at the end.
set -euo pipefail

KUBE_VERSION=v1.36.3       # k8s.io/kubernetes: kube-apiserver, and the node's kubelet, kube-proxy,
                           # kube-controller-manager and kube-scheduler
STAGING_VERSION=v0.36.3    # the published k8s.io/X modules of that release
ETCD_VERSION=v3.6.14       # go.etcd.io/etcd/server/v3
KUEUE_VERSIONS="v0.19.2 v0.17.0"   # accessProviders / credentialsProviders
CIA_VERSION=v0.1.3         # sigs.k8s.io/cluster-inventory-api: ClusterProfile CRD, secretreader
CONTAINERD_VERSION=v2.4.2  # the node's container runtime (image volumes need >= 2.1)
GGCR_VERSION=v0.22.1       # go-containerregistry's crane: the node's registry on loopback

cache=${CREDBROKER_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/credbroker-e2e}
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
die() { printf 'e2e/peers.sh: %s\n' "$*" >&2; exit 1; }
command -v go >/dev/null || die "go is missing (the Go toolchain builds the e2e peers)"
mkdir -p "$cache"
parts=${*:-env kueue cluster}
for p in $parts; do
    case $p in env | kueue | cluster) ;; *) die "unknown part $p (env, kueue or cluster)" ;; esac
done
part() { case " $parts " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
build() { nice -n 10 go build -trimpath "$@"; }
# shellcheck source=e2e/gowrap.sh
. "$(dirname "$0")/gowrap.sh"
moddir() { # module@version -> its directory in the module cache
    go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

# Where each peer goes, one directory per version.
kas=$cache/kube-apiserver-$KUBE_VERSION
etcd=$cache/etcd-$ETCD_VERSION
# The node (e2e/README.md "The node"): the same module's kubelet, kube-proxy, kube-controller-manager
# and kube-scheduler, into one directory.
node=$cache/kube-node-$KUBE_VERSION
node_bins="kubelet kube-proxy kube-controller-manager kube-scheduler"
node_missing() { for b in $node_bins; do [ -x "$node/$b" ] || return 0; done; return 1; }
cia=$cache/secretreader-$CIA_VERSION
ctrd=$cache/containerd-$CONTAINERD_VERSION
ggcr=$cache/crane-$GGCR_VERSION

part_env() {
    # Manifests from the same module versions: Kueue's CRDs and webhooks, the ClusterProfile CRD.
    ciadir=$(moddir "sigs.k8s.io/cluster-inventory-api@$CIA_VERSION")
    [ -f "$ciadir/config/crd/bases/multicluster.x-k8s.io_clusterprofiles.yaml" ] || die "no ClusterProfile CRD in cluster-inventory-api $CIA_VERSION"
    {
        echo "KUBE_VERSION=$KUBE_VERSION"
        echo "ETCD_VERSION=$ETCD_VERSION"
        echo "KUBE_APISERVER=$kas/kube-apiserver"
        echo "ETCD=$etcd/etcd"
        echo "SECRETREADER=$cia/secretreader"
        for b in $node_bins; do echo "$(echo "$b" | tr a-z- A-Z_)=$node/$b"; done
        echo "CONTAINERD_VERSION=$CONTAINERD_VERSION"
        echo "CONTAINERD=$ctrd/containerd"
        echo "CONTAINERD_SHIM=$ctrd/containerd-shim-runc-v2"
        echo "CTR=$ctrd/ctr"
        echo "CRANE=$ggcr/crane"
        echo "CLUSTERPROFILE_CRD_DIR=$ciadir/config/crd/bases"
        for kv in $KUEUE_VERSIONS; do
            kd=$(moddir "sigs.k8s.io/kueue@$kv")
            [ -d "$kd/config/components/crd/bases" ] || die "no CRDs in kueue $kv"
            [ -f "$kd/config/components/webhook/manifests.yaml" ] || die "no webhook manifests in kueue $kv"
            key=KUEUE_$(echo "$kv" | tr -d v | tr . _)
            echo "${key}=$cache/kueue-$kv/kueue"
            echo "${key}_DIR=$kd"
            # The ClusterProfile CRD of the cluster-inventory-api version this Kueue is built with.
            civ=$(awk '$1 == "sigs.k8s.io/cluster-inventory-api" {print $2}' "$kd/go.mod")
            [ -n "$civ" ] || die "kueue $kv requires no sigs.k8s.io/cluster-inventory-api"
            cd_=$(moddir "sigs.k8s.io/cluster-inventory-api@$civ")/config/crd/bases
            [ -f "$cd_/multicluster.x-k8s.io_clusterprofiles.yaml" ] || die "no ClusterProfile CRD in cluster-inventory-api $civ"
            echo "${key}_CLUSTERPROFILE_CRD_DIR=$cd_"
        done
    } > "$cache/peers.env.tmp"
    mv "$cache/peers.env.tmp" "$cache/peers.env"
}

part_kueue() {
    # Kueue: each version in its own module (its go.mod has no replaces, so `go install m@v` builds it
    # with exactly its own requirements; a shared module would bump its Kubernetes libraries).
    for kv in $KUEUE_VERSIONS; do
        d=$cache/kueue-$kv
        if [ ! -x "$d/kueue" ]; then
            mkdir -p "$d/gobin"
            GOBIN="$d/gobin" nice -n 10 go install -trimpath \
                -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kv" \
                "sigs.k8s.io/kueue/cmd/kueue@$kv" || die "kueue $kv did not build"
            mv "$d/gobin/kueue" "$d/kueue" && rmdir "$d/gobin"
        fi
    done
}

part_cluster() {
    # kube-apiserver and etcd: one wrapper module. k8s.io/kubernetes requires its staging modules
    # at v0.0.0 (replaced in its own go.mod, and a dependency's replaces are ignored), so the wrapper
    # replaces exactly those lines with the published $STAGING_VERSION (k8s.io/utils and other
    # pseudo-versions are real versions and stay).
    if [ ! -x "$kas/kube-apiserver" ] || [ ! -x "$etcd/etcd" ] || node_missing; then
        w=$cache/wrap-kube-$KUBE_VERSION-etcd-$ETCD_VERSION
        mkdir -p "$w" "$kas" "$etcd"
        (
            cd "$w"
            [ -f go.mod ] || go mod init credbroker-e2e-kube >/dev/null 2>&1
            gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
            [ -f "$gomod" ] || die "k8s.io/kubernetes@$KUBE_VERSION: no .mod file from the module proxy"
            staging=$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$gomod" | sort -u)
            [ -n "$staging" ] || die "k8s.io/kubernetes@$KUBE_VERSION: no k8s.io/X v0.0.0 requirements found"
            for m in $staging; do go mod edit -replace="$m=$m@$STAGING_VERSION"; done
            go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$KUBE_VERSION" "go.etcd.io/etcd/server/v3@$ETCD_VERSION" \
                "k8s.io/kubernetes/cmd/kubelet@$KUBE_VERSION" "k8s.io/kubernetes/cmd/kube-proxy@$KUBE_VERSION" \
                "k8s.io/kubernetes/cmd/kube-controller-manager@$KUBE_VERSION" "k8s.io/kubernetes/cmd/kube-scheduler@$KUBE_VERSION" \
                || die "cannot resolve kube-apiserver $KUBE_VERSION and etcd $ETCD_VERSION"
            # Kueue parses the server's /version: without these it reads v0.0.0-master+$Format:%H$ and exits.
            v=k8s.io/component-base/version
            minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
            if [ ! -x "$kas/kube-apiserver" ]; then
                build -ldflags "-s -w -X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor" \
                    -o "$kas/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver || die "kube-apiserver $KUBE_VERSION did not build"
                mv "$kas/kube-apiserver.tmp" "$kas/kube-apiserver"
            fi
            if node_missing; then
                # One build of the four: their packages compile once, in parallel, and link at once.
                rm -rf "$node.tmp" && mkdir -p "$node.tmp" "$node"
                build -ldflags "-s -w -X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor" \
                    -o "$node.tmp/" $(for b in $node_bins; do echo "k8s.io/kubernetes/cmd/$b"; done) \
                    || die "the node's binaries ($node_bins) $KUBE_VERSION did not build"
                for b in $node_bins; do mv "$node.tmp/$b" "$node/$b"; done
                rmdir "$node.tmp"
            fi
            if [ ! -x "$etcd/etcd" ]; then
                build -ldflags "-s -w" -o "$etcd/etcd.tmp" go.etcd.io/etcd/server/v3 || die "etcd $ETCD_VERSION did not build"
                mv "$etcd/etcd.tmp" "$etcd/etcd"
            fi
        ) || exit 1
    fi

    # cluster-inventory-api's secretreader exec plugin, through a wrapper module (e2e/gowrap.sh: the
    # proxy refuses this module's version list, which `go install m@v` asks for).
    if [ ! -x "$cia/secretreader" ]; then
        wrap_build "$cache" secretreader sigs.k8s.io/cluster-inventory-api "$CIA_VERSION" \
            sigs.k8s.io/cluster-inventory-api/plugins/secretreader/cmd/plugin "$cia/secretreader" -ldflags "-s -w" \
            || die "secretreader $CIA_VERSION did not build"
    fi

    # The node's container runtime: containerd, its runc shim and ctr (image import), one wrapper
    # module; runc itself and the CNI plugins are Debian's (scripts/test.sh installs them).
    for b in containerd containerd-shim-runc-v2 ctr; do
        [ -x "$ctrd/$b" ] && continue
        wrap_build "$cache" containerd github.com/containerd/containerd/v2 "$CONTAINERD_VERSION" \
            "github.com/containerd/containerd/v2/cmd/$b" "$ctrd/$b" \
            -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
            || die "$b $CONTAINERD_VERSION did not build"
    done
    # crane: `crane registry serve` is the registry the node pulls from (Kueue's Deployment says
    # imagePullPolicy: Always, so the kubelet pulls even an image containerd holds).
    if [ ! -x "$ggcr/crane" ]; then
        wrap_build "$cache" crane github.com/google/go-containerregistry "$GGCR_VERSION" \
            github.com/google/go-containerregistry/cmd/crane "$ggcr/crane" -ldflags "-s -w" \
            || die "crane $GGCR_VERSION did not build"
    fi
}

binaries() { # every binary peers.env names, of the parts asked for
    if part kueue; then for kv in $KUEUE_VERSIONS; do echo "$cache/kueue-$kv/kueue"; done; fi
    if part cluster; then
        echo "$kas/kube-apiserver" "$etcd/etcd" "$cia/secretreader" "$ctrd/containerd" \
            "$ctrd/containerd-shim-runc-v2" "$ctrd/ctr" "$ggcr/crane"
        for b in $node_bins; do echo "$node/$b"; done
    fi
}

for p in env kueue cluster; do
    if part "$p"; then "part_$p"; fi
done
for f in $(binaries); do
    [ -x "$f" ] || die "$f is missing after the build"
done
if part env; then printf 'e2e peers in %s:\n' "$cache"; sed 's/^/  /' "$cache/peers.env"; fi
