#!/usr/bin/env bash
# Builds the OCI images the real node runs, with umoci and no registry, and caches each as an
# OCI-layout tar under $RUNTIMEKIT_CACHE/images (default ~/.cache/runtimekit). Prints one line
# per image: `<reference> <tar>`, the reference being the name containerd's CRI looks up after
# `ctr -n k8s.io images import --base-name docker.io/local/<name> <tar>`.
#
#   e2e/scripts/build-images.sh [pause|busybox|operator|node-agent ...]   (default: pause busybox)
#
# pause       the pod sandbox: busybox sleeping forever (CRI needs only a non-empty entrypoint)
# busybox     the test image: busybox with every applet on PATH
# demo-app    the demo's workload: busybox that prints what its container was given, then sleeps
# operator    runtimekit-operator, a static release binary, running as the non-root user 65532
# node-agent  runtimekit-node-agent, runtimekit-node-installer and lj-runtime (static), and runtimekit-resource-layer, which
#             loads NVML with dlopen and so is linked against glibc, shipped in the image, and
#             the isolation library lj-runtime preloads into time-division containers
# cuda-test   runtimekit-cuda-probe with the fake driver as its libcuda.so.1 and glibc: what a CUDA
#             program in a time-division container meets (a test image, not a product)
#
# The product images are tagged with the workspace version; operator/Dockerfile and
# node-agent/Dockerfile build the same images on a machine with a container engine (a test keeps
# the two in step).
set -euo pipefail

cache=${RUNTIMEKIT_CACHE:-$HOME/.cache/runtimekit}/images
mkdir -p "$cache"
here=$(cd "$(dirname "$0")/../.." && pwd)
busybox=$(command -v busybox) || { echo "busybox-static is missing: run e2e/scripts/install-node-packages.sh" >&2; exit 1; }
command -v umoci >/dev/null || { echo "umoci is missing: run e2e/scripts/install-node-packages.sh" >&2; exit 1; }
# Images change only with the busybox they are made of.
version=$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null | tr -c 'A-Za-z0-9.\n' '_')

# build NAME CONFIG-ARGS...: a one-layer image of busybox, configured by umoci CONFIG-ARGS (the
# cached tar is named by both, so a changed configuration builds anew).
build() {
  local name=$1; shift
  local config; config=$(printf '%s\0' "$@" | sha256sum | cut -c1-12)
  local tar="$cache/$name-$version-$config.tar"
  if [ ! -s "$tar" ]; then
    local work; work=$(mktemp -d)
    trap 'rm -rf "$work"' RETURN
    umoci init --layout "$work/layout"
    umoci new --image "$work/layout:$name"
    umoci unpack --rootless --image "$work/layout:$name" "$work/bundle" >/dev/null
    mkdir -p "$work/bundle/rootfs/bin"
    install -m 0755 "$busybox" "$work/bundle/rootfs/bin/busybox"
    for applet in $("$busybox" --list); do
      [ "$applet" = busybox ] || ln -sf busybox "$work/bundle/rootfs/bin/$applet"
    done
    umoci repack --image "$work/layout:$name" "$work/bundle"
    umoci config --image "$work/layout:$name" --config.env PATH=/bin "$@"
    umoci tag --image "$work/layout:$name" 1
    umoci rm --image "$work/layout:$name"
    (cd "$work/layout" && tar cf "$tar.partial" .)
    mv "$tar.partial" "$tar"
    echo "built image $name from busybox $version" >&2
  fi
  echo "docker.io/local/$name:1 $tar"
}

target=x86_64-unknown-linux-gnu
release="$here/target/$target/release"
host_release="$here/target/release"

# Cargo shows its progress where someone watches (the demo's first build takes minutes).
quiet=(--quiet)
[ -t 2 ] && quiet=()

# release_binaries STATIC PACKAGE:TARGET...: one release build of every TARGET (a binary's name,
# or `lib` for the package's library), statically linked when STATIC is yes (glibc's crt-static;
# target-specific so the host's build scripts stay dynamic). One cargo run for all of them, so the
# dependencies they share are built once.
release_binaries() {
  local static=$1; shift
  [ $# -gt 0 ] || return 0
  local args=()
  for spec in "$@"; do
    if [ "${spec#*:}" = lib ]; then args+=(-p "${spec%%:*}" --lib); else args+=(-p "${spec%%:*}" --bin "${spec#*:}"); fi
  done
  echo "building ${*#*:} (release$([ "$static" = yes ] && echo ", static"))" >&2
  if [ "$static" = yes ]; then
    RUSTFLAGS="-C target-feature=+crt-static" cargo build "${quiet[@]}" --locked --release --target "$target" "${args[@]}" >&2
  else
    # The host's own release build, which `just soak` and the benchmarks share.
    cargo build "${quiet[@]}" --locked --release "${args[@]}" >&2
  fi
}

# product NAME USER ENTRYPOINT FILES...: a one-layer image of FILES (host-path:image-path), with
# an /etc/passwd naming USER, running as USER; the cached one when no file (nor this script) is
# newer than it.
product() {
  local name=$1 user=$2 entrypoint=$3; shift 3
  local version; version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/Cargo.toml" | head -1)
  local tar="$cache/runtimekit-$name-$version.tar"
  local inputs=("$0")
  for file in "$@"; do inputs+=("${file%%:*}"); done
  if [ -s "$tar" ] && [ -z "$(find "${inputs[@]}" -newer "$tar" 2>/dev/null)" ]; then
    echo "docker.io/local/runtimekit-$name:$version $tar"
    return
  fi
  local work; work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  umoci init --layout "$work/layout"
  umoci new --image "$work/layout:$name"
  umoci unpack --rootless --image "$work/layout:$name" "$work/bundle" >/dev/null
  local root="$work/bundle/rootfs"
  mkdir -p "$root/etc" "$root/tmp"
  chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  for file in "$@"; do
    case ${file#*:} in
      /usr/local/bin/*) install -D -m 0755 -s "${file%%:*}" "$root${file#*:}" ;; # no debug info
      *) install -D -m 0755 "${file%%:*}" "$root${file#*:}" ;;
    esac
  done
  umoci repack --image "$work/layout:$name" "$work/bundle"
  local config=(--config.user "$user" --config.env PATH=/usr/local/bin)
  [ -n "$entrypoint" ] && config+=(--config.entrypoint "$entrypoint")
  umoci config --image "$work/layout:$name" "${config[@]}"
  umoci tag --image "$work/layout:$name" "$version"
  umoci rm --image "$work/layout:$name"
  (cd "$work/layout" && tar cf "$tar.partial" .)
  mv "$tar.partial" "$tar"
  echo "built image runtimekit-$name:$version ($(du -h "$tar" | cut -f1))" >&2
  echo "docker.io/local/runtimekit-$name:$version $tar"
}

# The glibc files a dynamic binary needs (its ldd list), as host-path:image-path.
libraries_of() {
  ldd "$1" | awk '/=> \//{print $3} /^\t\/lib/{print $1}' | while read -r lib; do
    echo "$(readlink -f "$lib"):$lib"
  done
}

# What the demo's pods run in place of the usage guide's <your-image>: they say what they were
# given (card device files, RDMA devices, the preloaded isolation library, the variables the
# runtime set) and then stay running.
demo_app='echo "card device files: $(cd /dev && ls -d nvidia[0-9]* 2>/dev/null | tr "\n" " ")"
echo "RDMA devices: $(ls /dev/infiniband 2>/dev/null | tr "\n" " ")"
echo "preloaded: $(cat /etc/ld.so.preload 2>/dev/null)"
env | grep -E "^(NVIDIA|CUDA|RUNTIMEKIT)_" | sort
exec sleep infinity'

images=("$@")
[ ${#images[@]} -gt 0 ] || images=(pause busybox)

# What each product image is built from: static binaries (they run on any host, and the installer
# copies lj-runtime onto the node), and host builds (the resource layer loads NVML with dlopen,
# which a static glibc binary cannot; the isolation library is preloaded into containers).
declare -A static_targets=(
  [operator]="runtimekit-operator:runtimekit-operator"
  [node-agent]="runtimekit-node-agent:runtimekit-node-agent runtimekit-node-agent:runtimekit-node-installer runtimekit-lj-runtime:lj-runtime"
)
declare -A host_targets=(
  [node-agent]="runtimekit-resource-layer:runtimekit-resource-layer runtimekit-isolation:lib"
  [cuda-test]="runtimekit-isolation:runtimekit-cuda-probe runtimekit-fake-cuda:lib"
)
statics=() hosts=()
for image in "${images[@]}"; do
  # shellcheck disable=SC2206 # the lists are space-separated specs
  statics+=(${static_targets[$image]:-})
  # shellcheck disable=SC2206
  hosts+=(${host_targets[$image]:-})
done
# Every image asked for from one build of each kind (the demo's first run builds both at once).
release_binaries yes "${statics[@]}"
release_binaries no "${hosts[@]}"

for image in "${images[@]}"; do
  case $image in
    pause) build pause --config.entrypoint /bin/busybox --config.cmd sleep --config.cmd infinity ;;
    busybox) build busybox --config.cmd /bin/sh ;;
    demo-app) build demo-app --config.entrypoint /bin/sh --config.cmd -c --config.cmd "$demo_app" ;;
    operator)
      product operator 65532:65532 /usr/local/bin/runtimekit-operator \
        "$release/runtimekit-operator:/usr/local/bin/runtimekit-operator"
      ;;
    node-agent)
      mapfile -t libs < <(libraries_of "$host_release/runtimekit-resource-layer")
      product node-agent 0:0 "" \
        "$release/runtimekit-node-agent:/usr/local/bin/runtimekit-node-agent" \
        "$release/runtimekit-node-installer:/usr/local/bin/runtimekit-node-installer" \
        "$release/lj-runtime:/usr/local/bin/lj-runtime" \
        "$host_release/runtimekit-resource-layer:/usr/local/bin/runtimekit-resource-layer" \
        "$host_release/libruntimekit_isolation.so:/usr/local/lib/runtimekit/libruntimekit_isolation.so" "${libs[@]}"
      ;;
    cuda-test)
      mapfile -t libs < <(libraries_of "$host_release/runtimekit-cuda-probe"; libraries_of "$host_release/libruntimekit_fake_cuda.so")
      mapfile -t libs < <(printf '%s\n' "${libs[@]}" | sort -u)
      product cuda-test 0:0 /usr/local/bin/runtimekit-cuda-probe \
        "$host_release/runtimekit-cuda-probe:/usr/local/bin/runtimekit-cuda-probe" \
        "$host_release/libruntimekit_fake_cuda.so:/lib/x86_64-linux-gnu/libcuda.so.1" "${libs[@]}"
      ;;
    *) echo "unknown image: $image (expected pause, busybox, demo-app, operator, node-agent or cuda-test)" >&2; exit 2 ;;
  esac
done
