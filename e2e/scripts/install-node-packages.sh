#!/usr/bin/env bash
# Installs the Debian packages the real node needs (containerd, runc, the CNI plugins, and
# busybox-static and umoci to build its images) and the exporter's tests need (prometheus, for
# promtool and a real Prometheus server), only those missing, so a second run does nothing.
# Needs root (apt-get).
set -euo pipefail

packages=(containerd runc containernetworking-plugins busybox-static umoci prometheus)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing ${missing[*]} (the real node's runtime and image tools, Prometheus)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
# The tests start their own Prometheus on 127.0.0.1; the package's service must not run.
if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled prometheus >/dev/null 2>&1; then
  systemctl disable --now prometheus >&2 || true
fi
