#!/usr/bin/env bash
# Builds the OCI images the real node runs, with umoci and no registry, and caches each as an
# OCI-layout tar under $RUNTIMEKIT_CACHE/images (default ~/.cache/runtimekit). Prints one line
# per image: `<reference> <tar>`, the reference being the name containerd's CRI looks up after
# `ctr -n k8s.io images import --base-name docker.io/local/<name> <tar>`.
#
#   e2e/scripts/build-images.sh [pause|busybox ...]   (default: both)
#
# pause    the pod sandbox: busybox sleeping forever (CRI needs only a non-empty entrypoint)
# busybox  the test image: busybox with every applet on PATH
set -euo pipefail

cache=${RUNTIMEKIT_CACHE:-$HOME/.cache/runtimekit}/images
mkdir -p "$cache"
busybox=$(command -v busybox) || { echo "busybox-static is missing: run e2e/scripts/install-node-packages.sh" >&2; exit 1; }
command -v umoci >/dev/null || { echo "umoci is missing: run e2e/scripts/install-node-packages.sh" >&2; exit 1; }
# Images change only with the busybox they are made of.
version=$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null | tr -c 'A-Za-z0-9.\n' '_')

# build NAME CONFIG-ARGS...: a one-layer image of busybox, configured by umoci CONFIG-ARGS.
build() {
  local name=$1; shift
  local tar="$cache/$name-$version.tar"
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

images=("$@")
[ ${#images[@]} -gt 0 ] || images=(pause busybox)
for image in "${images[@]}"; do
  case $image in
    pause) build pause --config.entrypoint /bin/busybox --config.cmd sleep --config.cmd infinity ;;
    busybox) build busybox --config.cmd /bin/sh ;;
    *) echo "unknown image: $image (expected pause or busybox)" >&2; exit 2 ;;
  esac
done
