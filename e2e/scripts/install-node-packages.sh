#!/usr/bin/env bash
# Installs the Debian packages the real node needs (containerd, runc, the CNI plugins, and
# busybox-static and umoci to build its images), only those missing, so a second run does
# nothing. Needs root (apt-get).
set -euo pipefail

packages=(containerd runc containernetworking-plugins busybox-static umoci)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing ${missing[*]} (the real node's runtime and image tools)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
