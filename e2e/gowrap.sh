# Sourced by e2e/peers.sh and e2e/anchors.sh: the one recipe for building a package of a module
# at an exact version through a wrapper module. `go install m@v` also asks the proxy for the
# module's version list (deprecations), which this proxy refuses for some modules (403); a
# wrapper module that requires exactly m@v builds the same package with the same requirements
# (a dependency's replaces are ignored either way). The wrapper lives in the cache, not in git.
#
# wrap_build CACHE NAME MODULE VERSION PACKAGE OUT [go build flags...]
#   builds PACKAGE of MODULE@VERSION into OUT (atomically: OUT.tmp, then mv), with the wrapper
#   module in CACHE/wrap-NAME-VERSION. The caller exports CGO_ENABLED=0 GOTOOLCHAIN=local.
wrap_build() {
    local cache=$1 name=$2 module=$3 version=$4 pkg=$5 out=$6
    shift 6
    local w=$cache/wrap-$name-$version
    mkdir -p "$w" "$(dirname "$out")"
    (
        cd "$w"
        [ -f go.mod ] || go mod init "credbroker-e2e-$name" >/dev/null 2>&1
        go mod edit -require="$module@$version"
        GOFLAGS=-mod=mod nice -n 10 go build -trimpath "$@" -o "$out.tmp" "$pkg"
    ) || return 1
    mv "$out.tmp" "$out"
}
