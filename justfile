# Recipes for building, testing and running the GPU runtime kit. `./just` runs this file
# (installing `just` on first use); `just` works too where it is installed.

set shell := ["bash", "-euo", "pipefail", "-c"]

# List the recipes.
default:
    @{{just_executable()}} --justfile {{justfile()}} --list --unsorted

# The main job: the whole product on this machine. A control plane, a real node (containerd, runc, the kubelet) running the operator and the node agent deployed from config/, simulated nodes of every profile over two network pods, and the usage guide's examples placed and explained; it keeps running until `./just down`. The first run builds everything (minutes, with progress); later runs take under a minute.
demo:
    @[ "$(id -u)" = 0 ] || { echo "the demo runs containerd and a kubelet, which need root: run ./just demo from a root shell (sudo -i, then cd back here)" >&2; exit 1; }
    {{just_executable()}} --justfile {{justfile()}} node-packages
    cargo run --locked -p runtimekit-e2e --bin runtimekit-cluster -- demo

# The whole test suite, as CI runs it: formatting, lints, unit, property, CRD drift and end-to-end tests, then a 2-minute soak.
test: fmt-check lint unit soak-check

# Check formatting.
fmt-check:
    cargo fmt --all -- --check

# Format the code.
fmt:
    cargo fmt --all

# Lint every target with warnings as errors.
lint:
    cargo clippy --workspace --all-targets --locked -- -D warnings

# Every test of the workspace (the end-to-end suite starts a real control plane and a real node), then one line of totals.
unit: node-packages
    #!/usr/bin/env bash
    set -euo pipefail
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    # One machine holds one real node: a demo cluster left running would hold it.
    {{just_executable()}} --justfile {{justfile()}} down
    cargo test --workspace --locked 2>&1 | tee "$log"
    awk '/^test result:/ { passed += $4; failed += $6 } END { printf "%d passed, %d failed\n", passed, failed }' "$log"

# Only the end-to-end suite against a real control plane (arguments filter tests by name).
e2e *filter: node-packages
    cargo test --locked -p runtimekit-e2e --test e2e -- {{filter}}

# The end-to-end suite against another supported Kubernetes release (its tools module e2e/tools/k8s-<release>, built on first use), for example `just e2e-k8s 1.35`.
e2e-k8s release *filter: node-packages
    RUNTIMEKIT_K8S={{release}} cargo test --locked -p runtimekit-e2e --test e2e -- {{filter}}

# Install the Debian packages the real node needs (containerd, runc, CNI plugins, busybox-static, umoci), if missing.
node-packages:
    e2e/scripts/install-node-packages.sh

# Build the OCI images (operator and node agent from static release binaries, plus the real node's pause and busybox) with umoci, no registry; prints each image's reference and tar.
images:
    e2e/scripts/build-images.sh pause busybox operator node-agent

# Start a local control plane (etcd, kube-apiserver, controller-manager, JobSet, kwok) that keeps running; `--real-node` adds a real node (containerd and the kubelet).
up *flags:
    cargo run --quiet --locked -p runtimekit-e2e --bin runtimekit-cluster -- up {{flags}}

# Stop the cluster `just up` or `just demo` started, by the PIDs it recorded.
down:
    cargo run --quiet --locked -p runtimekit-e2e --bin runtimekit-cluster -- down

# Regenerate the CRD YAML under crds/ from the Rust types.
crds:
    cargo run --quiet -p runtimekit-crds --bin crdgen

# Check manifests (files or directories) against the resource contract.
check-pod +paths:
    cargo run --quiet -p runtimekit-operator -- check {{paths}}

# Build the pinned control-plane binaries (etcd, kube-*, JobSet, kwok, containerd, helm) into the cache.
build-tools:
    e2e/scripts/build-tools.sh

# Render config/'s manifests and docs/helm-values.md from the Helm chart (config/helm/runtimekit), the source of both.
config:
    e2e/scripts/render-config.sh

# Placement engine benchmark: decisions/s while 500 and 5,000 nodes fill, gangs, memory per card (table, then JSON).
bench-engine:
    cargo bench --locked -p runtimekit-placement --bench engine

# Churn the operator on 1,000 kwok nodes (default 50 pods/s for 30 min; for example `just soak --rate 20 --minutes 5`): invariants every minute, operator RSS, capacity back at the end.
soak *args:
    cargo build --quiet --locked --release -p runtimekit-operator -p runtimekit-e2e --bin runtimekit-operator --bin soak
    target/release/soak {{args}}

# The soak as CI runs it: 2 minutes at 25 pods/s, on the test build (no release build needed).
soak-check:
    cargo build --quiet --locked -p runtimekit-operator -p runtimekit-e2e --bin runtimekit-operator --bin soak
    target/debug/soak --minutes 2 --rate 25

# Scheduler benchmark on a real control plane with 1,000 kwok nodes: against kube-scheduler (backlog drains in BENCH_BACKLOG_PAIRS pairs, default 3, medians reported; what one more object per pod costs the apiserver; bursts, three steady runs, Binding ceiling), kube-scheduler allocating whole-card DRA claims on 100 nodes of 10 cards against ours by nvidia.com/gpu (BENCH_DRA_PAIRS pairs, default 3), against Volcano (built on first use, minutes), then grown to BENCH_SCALE_NODES (5,000) with JobSet gangs; a table per part, then JSON. `BENCH_SMOKE=1` runs the small form CI runs; BENCH_RUNS picks parts (peer-gangs: only Volcano's and our gangs, BENCH_PEER_GANGS of 8, default 100).
bench-scheduler:
    cargo build --quiet --locked --release -p runtimekit-operator -p runtimekit-e2e --bin runtimekit-operator --bin bench-scheduler
    target/release/bench-scheduler

# Install the kubectl plugin `kubectl gpu` (the binary kubectl-gpu) into DIR; with DIR on PATH, `kubectl gpu nodes` works.
kubectl-gpu-install dir:
    cargo build --quiet --release --locked -p runtimekit-kubectl-gpu
    install -D -m 0755 target/release/kubectl-gpu "{{dir}}/kubectl-gpu"
    @echo "installed {{dir}}/kubectl-gpu; with {{dir}} on PATH: kubectl gpu nodes | pods [-A] | explain POD"

# Package `kubectl gpu` for krew: target/krew/kubectl-gpu-linux-amd64.tar.gz and its manifest target/krew/gpu.yaml.
kubectl-gpu-package:
    cargo build --quiet --release --locked -p runtimekit-kubectl-gpu
    mkdir -p target/krew
    tar -C target/release -czf target/krew/kubectl-gpu-linux-amd64.tar.gz kubectl-gpu
    sed "s/SHA256_OF_THE_ARCHIVE/$(sha256sum target/krew/kubectl-gpu-linux-amd64.tar.gz | cut -d' ' -f1)/" operator/kubectl-gpu/krew.yaml > target/krew/gpu.yaml
    @echo "target/krew/gpu.yaml and target/krew/kubectl-gpu-linux-amd64.tar.gz"

# Build what the GPU checks run (release resource layer, CUDA probe and isolation library) into target/gpu-check, to carry to a machine with NVIDIA cards.
gpu-check-build:
    cargo build --release --locked -p runtimekit-resource-layer -p runtimekit-isolation
    mkdir -p target/gpu-check
    cp target/release/runtimekit-resource-layer target/release/runtimekit-cuda-probe target/release/libruntimekit_isolation.so target/gpu-check/

# Check the NVML backend against nvidia-smi on this machine's NVIDIA cards, from target/gpu-check (builds nothing).
gpu-check *args:
    e2e/gpu-check.sh {{args}}

# Check the isolation library against the real driver on card 0 (memory cap, queries, fault containment, launch overhead, the 30 % / 70 % compute cap with the resource layer's meter), from target/gpu-check (builds nothing).
gpu-check-isolation *args:
    e2e/gpu-check-isolation.sh {{args}}

# Exporter benchmark: 8 cards x 32 TDM slices; scrape latency, collector CPU at a 10 s interval, memory (table, then JSON).
bench-exporter:
    cargo bench --quiet --locked -p runtimekit-node-agent --bench exporter
