#!/usr/bin/env bash
# `make e2e`: the chaos suite on the offline local cluster with a real node, no registry needed.
#
#   1. the image, built offline from the Dockerfile (e2e/image/build.sh; cached);
#   2. the cluster: e2e/cluster/local.sh up --real-node (containerd, kubelet, kube-proxy);
#   3. the image loaded into the node's containerd (e2e/image/load.sh), dstream:<version>;
#   4. the README's "Run on Kubernetes" section, command by command (e2e/test_readme.py);
#   5. python -m e2e.chaos against it, checkpoint and output on a hostPath of this machine, then
#      its Kafka scenario (e2e/chaos/kafka.py), the broker on this machine's bridge address;
#   6. the cluster down again (every process by PID, bridge, netns, state), also on failure.
#
# Environment:
#   DSTREAM_E2E_DATA    the hostPath directory (default /tmp/dstream-e2e-data), emptied first
#   DSTREAM_E2E_KEEP=1  leave the cluster and the job running afterwards
#   DSTREAM_E2E_ARGS    more arguments for python -m e2e.chaos (e.g. "--executor-kills 5")
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly ROOT
readonly PYTHON="${ROOT}/.venv/bin/python"
readonly DATA="${DSTREAM_E2E_DATA:-/tmp/dstream-e2e-data}"
readonly REPORT="${DATA}/last-report.json"
# This machine's address on the pods' bridge (cni0): the Kafka scenario's broker listens there.
readonly POD_BRIDGE=10.244.0.1
# Pods reach the API server through the `kubernetes` Service's ClusterIP (kube-proxy), as before
# the cluster had a DNS (kubernetes.default.svc now resolves too; the main scenario keeps the
# settings it was measured with). The kubelet expands these variables in the driver pod.
# shellcheck disable=SC2016
readonly API_SERVER='https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)'

STARTED=${SECONDS}
step() { printf '\n=== e2e: %s (%s, %ss)\n' "$*" "$(date +%T)" "$((SECONDS - STARTED))" >&2; }

cluster_down() {
  if [[ "${DSTREAM_E2E_KEEP:-}" == 1 ]]; then
    step "keeping the cluster (DSTREAM_E2E_KEEP=1); stop it with: bash e2e/cluster/local.sh down"
    return
  fi
  step "cluster down"
  bash "${ROOT}/e2e/cluster/local.sh" down
}

main() {
  cd "${ROOT}"
  step "image (e2e/image/build.sh)"
  local tarball
  tarball="$(bash e2e/image/build.sh)"
  step "cluster up with a real node (e2e/cluster/local.sh up --real-node)"
  # Only a cluster this run started is taken down: `up` refuses when another one (say, a test
  # session's hollow cluster) runs, and a failed `up` stops what it started by itself.
  bash e2e/cluster/local.sh up --real-node
  trap cluster_down EXIT
  eval "$(bash e2e/cluster/local.sh env)"
  step "image into the node's containerd (e2e/image/load.sh)"
  bash e2e/image/load.sh "${CONTAINERD_ADDRESS}" "${tarball}" >/dev/null
  local image
  image="$(bash e2e/image/tag.sh)" # dstream:<version>, the chart's default image too
  step "the README's Kubernetes section (e2e/test_readme.py)"
  "${PYTHON}" -m pytest -ra -p no:cacheprovider e2e/test_readme.py
  step "chaos suite (python -m e2e.chaos)"
  # shellcheck disable=SC2086
  "${PYTHON}" -m e2e.chaos --kubeconfig "${KUBECONFIG}" --kubectl "$(command -v kubectl)" \
    --image "${image}" --host-path "${DATA}" --api-server "${API_SERVER}" \
    --report "${REPORT}" --kafka-host "${POD_BRIDGE}" ${DSTREAM_E2E_ARGS:-}
  step "passed; figures in ${REPORT}"
}

main "$@"
