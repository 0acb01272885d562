#!/usr/bin/env bash
# Builds the upstream control-plane binaries from the pinned Go tools modules in e2e/tools/
# and caches them by version under $RUNTIMEKIT_CACHE (default ~/.cache/runtimekit), so a
# second run takes seconds. Prints the directory holding each family's binaries.
#
#   e2e/scripts/build-tools.sh [k8s|etcd|jobset|kwok ...]   (default: all)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cache=${RUNTIMEKIT_CACHE:-$HOME/.cache/runtimekit}
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0

# module_version MODULE DIR: the version of MODULE that DIR/go.mod requires.
module_version() {
  (cd "$2" && go list -m -f '{{.Version}}' "$1")
}

# build FAMILY VERSION LDFLAGS PKG...: builds PKG... of e2e/tools/FAMILY into the cache.
build() {
  local family=$1 version=$2 ldflags=$3; shift 3
  local out="$cache/bin/$family-$version"
  if [ -f "$out/.complete" ]; then
    echo "$out"
    return
  fi
  echo "building $family $version ($*); a cold build takes minutes" >&2
  mkdir -p "$out"
  local start=$SECONDS
  (cd "$here/tools/$family" &&
    go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags "-s -w $ldflags" -o "$out/" "$@" >&2)
  touch "$out/.complete"
  echo "built $family $version in $((SECONDS - start)) s" >&2
  echo "$out"
}

build_k8s() {
  local v; v=$(module_version k8s.io/kubernetes "$here/tools/k8s")
  local minor=${v#v1.}; minor=${minor%%.*}
  local flags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  build k8s "$v" "$flags" k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
}

build_etcd() {
  local v; v=$(module_version go.etcd.io/etcd/server/v3 "$here/tools/etcd")
  # The main package is the module root, so go would name the binary "server".
  build etcd "$v" "" go.etcd.io/etcd/server/v3 >/dev/null
  local out="$cache/bin/etcd-$v"
  [ -f "$out/etcd" ] || mv "$out/server" "$out/etcd"
  echo "$out"
}

build_jobset() {
  local v; v=$(module_version sigs.k8s.io/jobset "$here/tools/jobset")
  build jobset "$v" "-X sigs.k8s.io/jobset/pkg/version.GitVersion=$v" sigs.k8s.io/jobset
}

build_kwok() {
  local v; v=$(module_version sigs.k8s.io/kwok "$here/tools/kwok")
  build kwok "$v" "-X sigs.k8s.io/kwok/pkg/consts.Version=${v#v}" sigs.k8s.io/kwok/cmd/kwok
}

families=("$@")
[ ${#families[@]} -gt 0 ] || families=(etcd kwok jobset k8s)
for family in "${families[@]}"; do
  case $family in
    k8s | etcd | jobset | kwok) "build_$family" ;;
    *) echo "unknown tool family: $family (expected k8s, etcd, jobset or kwok)" >&2; exit 2 ;;
  esac
done
