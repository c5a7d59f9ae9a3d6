#!/usr/bin/env bash
# The chaos suite on a throw-away kind cluster, for anyone with Docker:
#
#   make setup && bash e2e/kind.sh
#
# Creates a kind cluster whose node mounts a host directory (checkpoint and output live there,
# shared by the driver and executor pods, and read back by the suite), builds the image from the
# Dockerfile, loads it into the node, runs python -m e2e.chaos (its Kafka scenario too: the broker
# runs on this machine, on the kind network's gateway address, which the pods reach through the
# node), and deletes the cluster.
#
# Needs: docker, kind (https://kind.sigs.k8s.io), kubectl, and the repository's .venv.
# Environment:
#   DSTREAM_KIND_CLUSTER  cluster name (default dstream-e2e)
#   DSTREAM_KIND_IMAGE    node image (default: kind's own default)
#   DSTREAM_E2E_DATA      host directory for checkpoint and output (default /tmp/dstream-e2e-data)
#   DSTREAM_E2E_KEEP=1    keep the cluster afterwards (kind delete cluster --name ... removes it)
#   DSTREAM_E2E_ARGS      more arguments for python -m e2e.chaos
#   DSTREAM_E2E_KAFKA_HOST  this machine's address the pods reach for the Kafka scenario's broker
#                         (default: the kind network's IPv4 gateway, a bridge of this host on
#                         Linux; Docker Desktop has no such bridge: set it, or "none" to skip)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly ROOT
readonly PYTHON="${ROOT}/.venv/bin/python"
readonly CLUSTER="${DSTREAM_KIND_CLUSTER:-dstream-e2e}"
readonly DATA="${DSTREAM_E2E_DATA:-/tmp/dstream-e2e-data}"
IMAGE="$(bash "${ROOT}/e2e/image/tag.sh")" # dstream:<version>, as the README builds it
readonly IMAGE
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

# The kind network's IPv4 gateway: the host's end of the bridge the node's traffic leaves by.
kafka_host() {
  if [[ -n "${DSTREAM_E2E_KAFKA_HOST:-}" ]]; then
    echo "${DSTREAM_E2E_KAFKA_HOST}"
    return
  fi
  docker network inspect kind --format '{{range .IPAM.Config}}{{.Gateway}} {{end}}' |
    tr ' ' '\n' | grep -m1 -F '.' || die "no IPv4 gateway on docker network kind: set DSTREAM_E2E_KAFKA_HOST"
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
  local kafka=()
  local host
  host="$(kafka_host)"
  [[ "${host}" != none ]] && kafka=(--kafka-host "${host}")
  local kubeconfig
  kubeconfig="$(mktemp)"
  kind get kubeconfig --name "${CLUSTER}" >"${kubeconfig}"
  step "chaos suite (python -m e2e.chaos)"
  # kind has cluster DNS, so drivers use the defaults: the Service name and kubernetes.default.svc.
  # shellcheck disable=SC2086
  "${PYTHON}" -m e2e.chaos --kubeconfig "${kubeconfig}" --image "${IMAGE}" \
    --host-path "${DATA}" --driver-host service --report "${DATA}/last-report.json" \
    "${kafka[@]}" ${DSTREAM_E2E_ARGS:-}
  rm -f "${kubeconfig}"
}

main "$@"
