#!/usr/bin/env bash
# Renders the kustomize tree's manifests (config/<component>/*.yaml) from the Helm chart
# config/helm/runtimekit, so the two cannot drift: the chart's templates are the source, every
# optional part switched on, in the namespace runtimekit-system, without Helm's hooks. The CRDs and kube-state-metrics'
# configuration go the other way, into the chart (Helm reads only files inside it). The
# kustomization.yaml files, config/namespace.yaml and config/grafana are written by hand.
#
#   e2e/scripts/render-config.sh [OUT]   (default: config/ itself, and docs/helm-values.md;
#                                         e2e/tests/chart.rs renders into a temporary folder
#                                         and compares)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
chart="$here/config/helm/runtimekit"
out=${1:-$here/config}
helm="$("$here/e2e/scripts/build-tools.sh" helm)/helm"

if [ "$out" = "$here/config" ]; then
  install -m 0644 "$here"/crds/*.runtimekit.aliyun.com.yaml "$chart/crds/"
  install -m 0644 "$here/config/kube-state-metrics/custom-resource-state.yaml" "$chart/files/"
  # The configuration reference, from the values schema.
  (cd "$here" && cargo run --quiet --locked -p runtimekit-e2e --bin helm-values-reference -- "$chart") >"$here/docs/helm-values.md"
fi
render=$(mktemp -d)
trap 'rm -rf "$render"' EXIT
"$helm" template runtimekit "$chart" --namespace runtimekit-system \
  --set dra.enabled=true --set kubeStateMetrics.enabled=true --set podMonitor.enabled=true \
  --no-hooks --output-dir "$render" >/dev/null
(cd "$render/runtimekit/templates" && find . -type f -name '*.yaml' | sort) | while read -r file; do
  mkdir -p "$(dirname "$out/$file")"
  # Helm writes each document as `---`, `# Source: <template>`, the document: the file keeps the
  # documents, separated by `---`.
  awk 'NR == 1 && $0 == "---" { next }
       /^# Source: / { next }
       $0 == "" { blank++; next }
       { if ($0 == "---") blank = 0; while (blank > 0) { print ""; blank-- } print }' \
    "$render/runtimekit/templates/$file" >"$out/$file"
done
