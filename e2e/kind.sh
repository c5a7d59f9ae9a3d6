#!/usr/bin/env bash
# The chaos suite on a throw-away kind cluster, for anyone with Docker:
#
#   make setup && bash e2e/kind.sh
#
# Creates a kind cluster whose node mounts a host directory (checkpoint and output live there,
# shared by the driver and executor pods, and read back by the suite), builds the image from the
# Dockerfile, loads it into the node, runs python -m e2e.chaos, and deletes the cluster.
#
# Needs: docker, kind (https://kind.sigs.k8s.io), kubectl, and the repository's .venv.
# Environment:
#   DSTREAM_KIND_CLUSTER  cluster name (default dstream-e2e)
#   DSTREAM_KIND_IMAGE    node image (default: kind's own default)
#   DSTREAM_E2E_DATA      host directory for checkpoint and output (default /tmp/dstream-e2e-data)
#   DSTREAM_E2E_KEEP=1    keep the cluster afterwards (kind delete cluster --name ... removes it)
#   DSTREAM_E2E_ARGS      more arguments for python -m e2e.chaos
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly ROOT
readonly PYTHON="${ROOT}/.venv/bin/python"
readonly CLUSTER="${DSTREAM_KIND_CLUSTER:-dstream-e2e}"
readonly DATA="${DSTREAM_E2E_DATA:-/tmp/dstream-e2e-data}"
readonly IMAGE=dstream:e2e
readonly CREATE_TIMEOUT=300s

STARTED=${SECONDS}
step() { printf '\n=== kind e2e: %s (%s, %ss)\n' "$*" "$(date +%T)" "$((SECONDS - STARTED))" >&2; }
die() {
  echo "kind.sh: $*" >&2
  exit 1
}

check_tools() {
  local tool
  for tool in docker kind kubectl; do
    command -v "${tool}" >/dev/null || die "${tool} is not on PATH"
  done
  [[ -x "${PYTHON}" ]] || die "no ${PYTHON}: run 'make setup' first"
}

# The node sees the host directory at the same path, so the suite's --host-path is both.
create_cluster() {
  mkdir -p "${DATA}"
  local node_image=()
  [[ -n "${DSTREAM_KIND_IMAGE:-}" ]] && node_image=(--image "${DSTREAM_KIND_IMAGE}")
  kind create cluster --name "${CLUSTER}" "${node_image[@]}" --wait "${CREATE_TIMEOUT}" \
    --config=- <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
    extraMounts:
      - hostPath: ${DATA}
        containerPath: ${DATA}
EOF
}

delete_cluster() {
  if [[ "${DSTREAM_E2E_KEEP:-}" == 1 ]]; then
    step "keeping cluster ${CLUSTER} (kind delete cluster --name ${CLUSTER} removes it)"
    return
  fi
  step "deleting cluster ${CLUSTER}"
  kind delete cluster --name "${CLUSTER}"
}

main() {
  cd "${ROOT}"
  check_tools
  step "creating kind cluster ${CLUSTER}"
  create_cluster
  trap delete_cluster EXIT
  step "building ${IMAGE}"
  docker build --tag "${IMAGE}" "${ROOT}"
  step "loading ${IMAGE} into the node"
  kind load docker-image "${IMAGE}" --name "${CLUSTER}"
  local kubeconfig
  kubeconfig="$(mktemp)"
  kind get kubeconfig --name "${CLUSTER}" >"${kubeconfig}"
  step "chaos suite (python -m e2e.chaos)"
  # kind has cluster DNS, so drivers use the defaults: the Service name and kubernetes.default.svc.
  # shellcheck disable=SC2086
  "${PYTHON}" -m e2e.chaos --kubeconfig "${kubeconfig}" --image "${IMAGE}" \
    --host-path "${DATA}" --driver-host service --report "${DATA}/last-report.json" \
    ${DSTREAM_E2E_ARGS:-}
  rm -f "${kubeconfig}"
}

main "$@"
