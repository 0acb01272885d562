#!/usr/bin/env bash
# Builds the upstream control-plane binaries from the pinned Go tools modules in e2e/tools/
# and caches them by version under $RUNTIMEKIT_CACHE (default ~/.cache/runtimekit), so a
# second run takes seconds. Prints, for each family, the directory holding its binaries.
#
#   e2e/scripts/build-tools.sh [k8s|k8s-1.35|etcd|jobset|kwok|containerd|helm|volcano ...]
#   Default: etcd, kwok, jobset, k8s (the current release), containerd (the real node's
#   runtime) and helm (which installs the kit's chart). k8s-1.35 is the oldest supported release, for `just e2e-k8s 1.35`; volcano is the
#   scheduler benchmark's peer.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cache=${RUNTIMEKIT_CACHE:-$HOME/.cache/runtimekit}
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0

# module_version MODULE FAMILY: the version of MODULE that e2e/tools/FAMILY/go.mod requires.
module_version() {
  (cd "$here/tools/$2" && go list -m -f '{{.Version}}' "$1")
}

# The binaries of the families asked for, counted as they are built or found, so a cold build
# says how far it is.
declare -A per_family=([etcd]=1 [kwok]=1 [jobset]=1 [k8s]=5 [k8s-1.35]=5 [containerd]=3 [helm]=1 [volcano]=1)
total=0
counted=0

# build FAMILY VERSION LDFLAGS NAME=PACKAGE...: builds each PACKAGE of e2e/tools/FAMILY (or of
# $tools_dir) into the cache as NAME, skipping binaries already there.
build() {
  local family=$1 version=$2 ldflags=$3; shift 3
  local out="$cache/bin/$family-$version"
  mkdir -p "$out"
  for target in "$@"; do
    local name=${target%%=*} package=${target#*=}
    counted=$((counted + 1))
    [ -x "$out/$name" ] && continue
    echo "building $name $version from $package ($counted of $total; a cold build takes minutes)" >&2
    local start=$SECONDS
    (cd "${build_dir:-$here/tools/${tools_dir:-$family}}" &&
      go build -trimpath -tags="${tags:-selinux,notest,grpcnotrace}" -ldflags "-s -w $ldflags" -o "$out/$name.partial" "$package" >&2)
    mv "$out/$name.partial" "$out/$name"
    echo "built $name in $((SECONDS - start)) s" >&2
  done
  echo "$out"
}

# build_k8s [TOOLS_DIR]: the Kubernetes binaries of e2e/tools/TOOLS_DIR (default k8s), cached
# as k8s-<version> whichever module pins them.
build_k8s() {
  local tools_dir=${1:-k8s}
  local v; v=$(module_version k8s.io/kubernetes "$tools_dir")
  local minor=${v#v1.}; minor=${minor%%.*}
  local flags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  local cmd=k8s.io/kubernetes/cmd
  build k8s "$v" "$flags" kube-apiserver=$cmd/kube-apiserver \
    kube-controller-manager=$cmd/kube-controller-manager kube-scheduler=$cmd/kube-scheduler \
    kubectl=$cmd/kubectl kubelet=$cmd/kubelet
}

build_etcd() {
  local v; v=$(module_version go.etcd.io/etcd/server/v3 etcd)
  build etcd "$v" "" etcd=go.etcd.io/etcd/server/v3
}

build_jobset() {
  local v; v=$(module_version sigs.k8s.io/jobset jobset)
  build jobset "$v" "-X sigs.k8s.io/jobset/pkg/version.GitVersion=$v" jobset=sigs.k8s.io/jobset
  # The controller needs its CRD installed; keep the one of this exact version beside it.
  local dir; dir=$(cd "$here/tools/jobset" && go list -m -f '{{.Dir}}' sigs.k8s.io/jobset)
  install -m 0644 "$dir/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" "$cache/bin/jobset-$v/jobset-crd.yaml"
}

build_kwok() {
  local v; v=$(module_version sigs.k8s.io/kwok kwok)
  build kwok "$v" "-X sigs.k8s.io/kwok/pkg/consts.Version=${v#v}" kwok=sigs.k8s.io/kwok/cmd/kwok
  # kwok v0.8 has no pod stages of its own: its fast ones as they are (Job pods complete the
  # moment they run), and without the one that completes Job pods, for a cluster whose jobs
  # should keep running (the demo's gang).
  local dir; dir=$(cd "$here/tools/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  local stages="$dir/kustomize/stage/pod/fast"
  { cat "$stages/pod-ready.yaml"; echo "---"; cat "$stages/pod-complete.yaml"; echo "---"; cat "$stages/pod-delete.yaml"; } >"$cache/bin/kwok-$v/pod-stages.yaml"
  { cat "$stages/pod-ready.yaml"; echo "---"; cat "$stages/pod-delete.yaml"; } >"$cache/bin/kwok-$v/pod-stages-running.yaml"
  # kwok's own node stages for clusters with node leases, named explicitly: its default picks
  # them by the opposite of the lease flag (getDefaultNodeStages(leaseSeconds == 0) in v0.7.0),
  # so with leases on it patched every node's status every 20 to 45 s, not every 600 to 1,210.
  local nodes="$dir/kustomize/stage/node"
  { cat "$nodes/fast/node-initialize.yaml"; echo "---"; cat "$nodes/heartbeat-with-lease/node-heartbeat-with-lease.yaml"; } >"$cache/bin/kwok-$v/node-stages-lease.yaml"
}

# containerd 2 with its CRI plugin, which resolves CDI device IDs (Debian's 1.6 predates CDI),
# its runc shim and ctr, built static as upstream's release is (no cgo, so no btrfs snapshotter).
build_containerd() {
  local v; v=$(module_version github.com/containerd/containerd/v2 containerd)
  local pkg=github.com/containerd/containerd/v2
  tags=urfave_cli_no_docs,osusergo,netgo,static_build build containerd "$v" \
    "-X $pkg/version.Version=$v -X $pkg/version.Package=$pkg" \
    containerd=$pkg/cmd/containerd containerd-shim-runc-v2=$pkg/cmd/containerd-shim-runc-v2 ctr=$pkg/cmd/ctr
}

build_helm() {
  local v; v=$(module_version helm.sh/helm/v4 helm)
  build helm "$v" "-X helm.sh/helm/v4/internal/version.version=$v -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
    helm=helm.sh/helm/v4/cmd/helm
}

build_volcano() {
  local v; v=$(cat "$here/tools/volcano/version")
  local out="$cache/bin/volcano-$v"
  # The release's own module, copied out of the read-only module cache to build in place.
  if [ ! -x "$out/vc-scheduler" ]; then
    local dir src
    dir=$(go mod download -json "volcano.sh/volcano@$v" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    src=$(mktemp -d)
    cp -r "$dir/." "$src"
    chmod -R u+w "$src"
    mkdir -p "$out"
    cp "$src"/config/crd/volcano/bases/scheduling.volcano.sh_{podgroups,queues}.yaml "$out/"
    GOFLAGS=-mod=readonly build_dir=$src build volcano "$v" "" vc-scheduler=./cmd/scheduler >/dev/null
    rm -rf "$src"
  else
    counted=$((counted + 1))
  fi
  echo "$out"
}

families=("$@")
[ ${#families[@]} -gt 0 ] || families=(etcd kwok jobset k8s containerd helm)
for family in "${families[@]}"; do total=$((total + ${per_family[$family]:-0})); done
for family in "${families[@]}"; do
  case $family in
    k8s | etcd | jobset | kwok | containerd | helm | volcano) "build_$family" ;;
    k8s-1.35) build_k8s "$family" ;;
    *) echo "unknown tool family: $family (expected k8s, k8s-1.35, etcd, jobset, kwok, containerd, helm or volcano)" >&2; exit 2 ;;
  esac
done
