#!/usr/bin/env bash
# Builds the Helm CLI once and prints its path: the README's Kubernetes section runs `helm
# install`, and this machine has no helm. `go install helm.sh/helm/v3/cmd/helm@VERSION` (the
# module from the Go module proxy), cached beside the Kubernetes binaries:
#
#   bash e2e/cluster/helm.sh            prints .../helm-<version>/bin/helm, building it if missing
#
# Helm 3, not 4: its client libraries still speak to the Kubernetes 1.20 the tests run.
# Environment: DSTREAM_K8S_CACHE (default /var/cache/dstream-k8s), as local.sh.
set -euo pipefail

readonly VERSION=v3.21.4
readonly DIR="${DSTREAM_K8S_CACHE:-/var/cache/dstream-k8s}/helm-${VERSION}"
readonly BINARY="${DIR}/bin/helm"
readonly LOCK_TIMEOUT=1800

if [[ ! -x "${BINARY}" ]]; then
  command -v go >/dev/null || { echo "helm.sh: no go on PATH to build Helm with" >&2; exit 1; }
  mkdir -p "${DIR}"
  echo "helm.sh: building Helm ${VERSION} (go install; log: ${DIR}/build.log)" >&2
  (
    flock -w "${LOCK_TIMEOUT}" 7 || exit 1
    [[ -x "${BINARY}" ]] && exit 0
    env -u GOFLAGS GOPATH="${DIR}/go" GOMODCACHE="${DIR}/go/mod" GOCACHE="${DIR}/go/cache" \
      GOBIN="${DIR}/bin" CGO_ENABLED=0 GOFLAGS=-modcacherw \
      go install "helm.sh/helm/v3/cmd/helm@${VERSION}" >"${DIR}/build.log" 2>&1
  ) 7>"${DIR}/.build.lock" || {
    echo "helm.sh: building Helm failed, last lines of ${DIR}/build.log:" >&2
    tail -n 20 "${DIR}/build.log" >&2
    exit 1
  }
fi
echo "${BINARY}"
