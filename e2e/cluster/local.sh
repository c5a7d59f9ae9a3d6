#!/usr/bin/env bash
# A real Kubernetes v1.20.2 control plane on loopback, built offline from Debian's source package.
#
#   bash e2e/cluster/local.sh up       install, build once (cached), start, wait until ready
#   bash e2e/cluster/local.sh up --real-node   the same with a real kubelet node (see below)
#   bash e2e/cluster/local.sh env      print the exports that point kubectl/clients at it
#   bash e2e/cluster/local.sh status   say what runs
#   bash e2e/cluster/local.sh down     stop every process `up` started, remove the state dir
#   bash e2e/cluster/local.sh build    only install packages and build the binaries
#
# What runs: etcd, kube-apiserver (https://127.0.0.1:6443, static-token auth, Node+RBAC),
# kube-controller-manager, kube-scheduler and one kubemark hollow node (`kubemark --morph=kubelet`)
# on which scheduled pods report Running without executing anything.
# With --real-node (or DSTREAM_K8S_NODE=real) a real node runs pods instead of the hollow one:
# containerd, a CNI bridge on 10.244.0.0/24, kubelet and kube-proxy (real-node.sh); the API server
# then listens on the bridge address https://10.244.0.1:6443, where pods reach it too.
# See shared/notes/offline-kubernetes.md for why each piece is the way it is.
#
# Environment:
#   DSTREAM_K8S_CACHE  where binaries and the source tree are kept (default /var/cache/dstream-k8s)
#   DSTREAM_K8S_STATE  pki, kubeconfigs, etcd data, logs and pids of a running cluster
#                      (default /tmp/dstream-k8s-state)
#   DSTREAM_K8S_READY_TIMEOUT  seconds to wait for each component (default 120)
#   DSTREAM_K8S_NODE   hollow (default) or real: the node `up` starts
set -Eeuo pipefail

readonly K8S_VERSION=v1.20.2
readonly CACHE_DIR="${DSTREAM_K8S_CACHE:-/var/cache/dstream-k8s}/${K8S_VERSION}"
readonly BIN_DIR="${CACHE_DIR}/bin"
readonly SRC_PARENT="${CACHE_DIR}/src"
readonly SRC_DIR="${SRC_PARENT}/kubernetes-${K8S_VERSION#v}"
readonly STATE_DIR="${DSTREAM_K8S_STATE:-/tmp/dstream-k8s-state}"
readonly READY_TIMEOUT="${DSTREAM_K8S_READY_TIMEOUT:-120}"
readonly GOROOT_119=/usr/lib/go-1.19

readonly APISERVER_PORT=6443
readonly ETCD_CLIENT_PORT=2379
readonly ETCD_PEER_PORT=2380
readonly CONTROLLER_MANAGER_PORT=10257
readonly SCHEDULER_PORT=10259
readonly HOLLOW_KUBELET_PORT=11250
# The hollow kubelet takes an IP-shaped --name as its InternalIP. Any other name makes it look the
# name up in DNS and fall back to the host's default-route address, which the API server would then
# dial for logs/exec; this keeps every connection on loopback.
readonly HOLLOW_NODE_NAME=127.0.0.1

# Server binaries built from the tree; kubelet and kube-proxy are for a real node (later work).
readonly COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubemark kubelet kube-proxy kubectl)
readonly CONTROL_PLANE=(etcd kube-apiserver kube-controller-manager kube-scheduler)

# The node kind (hollow or real) decides the components, the node's name and where the API server
# listens; set_node_kind sets these.
NODE_KIND=""
COMPONENTS=() # start order; `down` stops in reverse
NODE_NAME=""
APISERVER_HOST=""
APISERVER_URL=""

# The Debian packages it needs (build, etcd, the real node) are in the project's one list.
PACKAGE_INSTALLER="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.ci/install-debian-packages"
readonly PACKAGE_INSTALLER

CURRENT_STEP="starting"

# shellcheck source=e2e/cluster/real-node.sh
source "$(dirname "${BASH_SOURCE[0]}")/real-node.sh"

set_node_kind() {
  NODE_KIND="$1"
  case "${NODE_KIND}" in
  hollow)
    COMPONENTS=("${CONTROL_PLANE[@]}" hollow-node)
    NODE_NAME="${HOLLOW_NODE_NAME}"
    APISERVER_HOST=127.0.0.1
    ;;
  real)
    COMPONENTS=("${CONTROL_PLANE[@]}" containerd coredns kubelet kube-proxy)
    NODE_NAME="${REAL_NODE_NAME}"
    APISERVER_HOST="${REAL_NODE_IP}"
    ;;
  *)
    echo "unknown node kind '${NODE_KIND}' (DSTREAM_K8S_NODE: hollow or real)" >&2
    exit 2
    ;;
  esac
  APISERVER_URL="https://${APISERVER_HOST}:${APISERVER_PORT}"
}

# The node kind of the cluster in the state dir, if any.
recorded_node_kind() {
  cat "${STATE_DIR}/node-kind" 2>/dev/null || echo hollow
}

log() { printf '[local.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
  log "FAILED during step: ${CURRENT_STEP}: $*"
  stop_after_failed_up
  exit 1
}

step() {
  CURRENT_STEP="$*"
  log "step: $*"
}

on_error() {
  local rc=$?
  log "FAILED during step: ${CURRENT_STEP} (exit ${rc})"
  stop_after_failed_up
  exit "${rc}"
}

# A failed `up` stops whatever it had started, but keeps the state dir for its logs.
UP_STARTED_COMPONENTS=false
stop_after_failed_up() {
  if [[ "${UP_STARTED_COMPONENTS}" == true ]]; then
    UP_STARTED_COMPONENTS=false
    stop_components
    log "stopped the components; their logs are in ${STATE_DIR}/logs"
  fi
}

# hold_lock FILE FD: takes an exclusive lock held until this script exits, so that two runs
# (say, two test sessions) neither build into the same tree nor start the same cluster at once.
# The processes the script starts must not inherit FD (see start_component).
readonly LOCK_FDS=(8 9)
readonly LOCK_TIMEOUT=3600
hold_lock() {
  local file="$1" fd="$2"
  eval "exec ${fd}>\"\${file}\""
  if ! flock -n "${fd}"; then
    log "waiting (at most ${LOCK_TIMEOUT}s) for another run of this script holding ${file}"
    flock -w "${LOCK_TIMEOUT}" "${fd}" || die "${file} still locked after ${LOCK_TIMEOUT}s"
  fi
}

# ---------------------------------------------------------------------------------------------
# Packages and source

need_root() {
  [[ "$(id -u)" == 0 ]] || die "must run as root (apt-get install, /var/cache)"
}

apt_updated=false
apt_update_once() {
  if [[ "${apt_updated}" == false ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    apt_updated=true
  fi
}

install_apt_packages() {
  step "installing the missing Debian packages of .ci/debian-packages"
  bash "${PACKAGE_INSTALLER}" || die "could not install the Debian packages (see above)"
}

has_bookworm_deb_src() {
  grep -rqsE '^(deb-src[[:space:]].*bookworm|Types:.*deb-src)' \
    /etc/apt/sources.list /etc/apt/sources.list.d/
}

# deb-src entries mirroring the configured deb ones (deb822 .sources files or one-line lists).
add_deb_src() {
  local out=/etc/apt/sources.list.d/dstream-deb-src.sources
  log "adding deb-src entries for bookworm in ${out}"
  local f found=false
  : >"${out}.tmp"
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -e "$f" && "$f" != "${out}" ]] || continue
    if grep -q 'bookworm' "$f"; then
      sed 's/^Types:[[:space:]]*deb[[:space:]]*$/Types: deb-src/' "$f" >>"${out}.tmp"
      printf '\n' >>"${out}.tmp"
      found=true
    fi
  done
  if [[ "${found}" == false && -f /etc/apt/sources.list ]]; then
    rm -f "${out}.tmp"
    out=/etc/apt/sources.list.d/dstream-deb-src.list
    grep -E '^deb[[:space:]].*bookworm' /etc/apt/sources.list | sed 's/^deb /deb-src /' >"${out}.tmp"
    [[ -s "${out}.tmp" ]] && found=true
  fi
  [[ "${found}" == true ]] || die "no bookworm 'deb' entry in /etc/apt to derive a deb-src from"
  mv "${out}.tmp" "${out}"
  apt_updated=false
}

fetch_kubernetes_source() {
  step "fetching the kubernetes source package (apt-get source --download-only kubernetes)"
  if [[ -f "${SRC_DIR}/go.mod" && -f "${SRC_DIR}/.dstream-unpacked" ]]; then
    log "source tree already at ${SRC_DIR}"
    return
  fi
  has_bookworm_deb_src || add_deb_src
  apt_update_once
  mkdir -p "${SRC_PARENT}"
  (cd "${SRC_PARENT}" && apt-get source --download-only kubernetes >"${CACHE_DIR}/apt-source.log" 2>&1) ||
    die "apt-get source failed, see ${CACHE_DIR}/apt-source.log"
  local orig
  orig="$(find "${SRC_PARENT}" -maxdepth 1 -name "kubernetes_*really${K8S_VERSION#v}.orig.tar.gz" |
    head -n1)"
  [[ -n "${orig}" ]] || die "no kubernetes_*really${K8S_VERSION#v}.orig.tar.gz in ${SRC_PARENT}: \
Debian's kubernetes source is no longer ${K8S_VERSION}?"
  step "unpacking ${orig##*/}"
  rm -rf "${SRC_DIR}"
  tar -xzf "${orig}" -C "${SRC_PARENT}"
  [[ -f "${SRC_DIR}/go.mod" ]] || die "unpacking ${orig} did not give ${SRC_DIR}"
  touch "${SRC_DIR}/.dstream-unpacked"
}

# The vendored reflect2 v1.0.1 makes a Go 1.19 kube-apiserver die with "fatal error: fault" on the
# first custom resource write; Debian's 1.0.2 is the fixed version.
replace_vendored_reflect2() {
  step "replacing vendor/github.com/modern-go/reflect2 with Debian's 1.0.2"
  local debian_copy=/usr/share/gocode/src/github.com/modern-go/reflect2
  [[ -f "${debian_copy}/go_above_118.go" ]] ||
    die "${debian_copy} is not reflect2 >= 1.0.2 (golang-github-modern-go-reflect2-dev)"
  if diff -rq "${debian_copy}" "${SRC_DIR}/vendor/github.com/modern-go/reflect2" >/dev/null 2>&1; then
    log "already replaced"
    return
  fi
  rm -rf "${SRC_DIR}/vendor/github.com/modern-go/reflect2"
  cp -r "${debian_copy}" "${SRC_DIR}/vendor/github.com/modern-go/reflect2"
}

# ---------------------------------------------------------------------------------------------
# Build

all_binaries_built() {
  local cmd
  for cmd in "${COMMANDS[@]}"; do
    [[ -x "${BIN_DIR}/${cmd}" ]] || return 1
  done
}

# Runs make in the background and reports while it runs: each binary as it appears, and a
# "still building" line every 30 s; returns make's exit code.
run_make_with_progress() {
  local out_dir="${SRC_DIR}/_output/local/go/bin" started=$SECONDS next_report=$((SECONDS + 30)) pid cmd
  local -A reported=()
  local stamp="${CACHE_DIR}/.build-started"
  touch "${stamp}"
  make_targets &
  pid=$!
  while kill -0 "${pid}" 2>/dev/null; do
    sleep 1
    for cmd in "${COMMANDS[@]}"; do
      if [[ -z "${reported[${cmd}]:-}" && "${out_dir}/${cmd}" -nt "${stamp}" ]]; then
        reported[${cmd}]=1
        log "built ${cmd} ($((SECONDS - started))s, ${#reported[@]}/${#COMMANDS[@]})"
      fi
    done
    if ((SECONDS >= next_report)); then
      next_report=$((SECONDS + 30))
      log "still building Kubernetes ${K8S_VERSION} ($((SECONDS - started))s, \
${#reported[@]}/${#COMMANDS[@]} binaries; build.log: $(tail -n 1 "${CACHE_DIR}/build.log" | tr -s ' '))"
    fi
  done
  wait "${pid}"
}

# The tree's own build: runs the code generators (pkg/generated/openapi is not in the tarball),
# then compiles; static binaries except kubelet and kubemark, which use cgo.
# (A plain module-mode `go build -mod=vendor` fails on this tree with Go 1.19: "updates to go.mod
# needed"; and it would still need make's openapi-gen and GOPATH layout.)
make_targets() {
  local cmd targets=()
  for cmd in "${COMMANDS[@]}"; do targets+=("cmd/${cmd}"); done
  (
    cd "${SRC_DIR}"
    env -u GOFLAGS -u GO111MODULE -u GOPATH -u GOROOT -u GOCACHE -u GOBIN \
      PATH="${GOROOT_119}/bin:${PATH}" make WHAT="${targets[*]}"
  ) >>"${CACHE_DIR}/build.log" 2>&1
}

build_binaries() {
  if all_binaries_built; then
    log "binaries cached in ${BIN_DIR}"
    return
  fi
  need_root
  mkdir -p "${CACHE_DIR}"
  hold_lock "${CACHE_DIR}/.build.lock" "${LOCK_FDS[0]}"
  if all_binaries_built; then
    log "binaries were built by a concurrent run; cached in ${BIN_DIR}"
    return
  fi
  install_apt_packages
  fetch_kubernetes_source
  replace_vendored_reflect2
  step "building ${COMMANDS[*]} with make (cold: 6 min or more on 2 cores; log: \
${CACHE_DIR}/build.log)"
  local started=$SECONDS
  : >"${CACHE_DIR}/build.log"
  run_make_with_progress ||
    die "build failed, last lines of ${CACHE_DIR}/build.log:
$(tail -n 30 "${CACHE_DIR}/build.log")"
  step "copying binaries to ${BIN_DIR}"
  mkdir -p "${BIN_DIR}"
  local cmd
  for cmd in "${COMMANDS[@]}"; do
    install -m 0755 "${SRC_DIR}/_output/local/go/bin/${cmd}" "${BIN_DIR}/${cmd}.tmp"
    mv "${BIN_DIR}/${cmd}.tmp" "${BIN_DIR}/${cmd}"
  done
  log "built in $((SECONDS - started))s"
}

# ---------------------------------------------------------------------------------------------
# State: pki, tokens, kubeconfigs

generate_pki() {
  step "generating CA, serving certificate and service-account keys"
  local pki="${STATE_DIR}/pki"
  mkdir -p "${pki}"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=dstream-local-ca" \
    -keyout "${pki}/ca.key" -out "${pki}/ca.crt" 2>/dev/null
  cat >"${pki}/apiserver.ext" <<'EOF'
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:10.244.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "${pki}/apiserver.key" -out "${pki}/apiserver.csr" 2>/dev/null
  openssl x509 -req -in "${pki}/apiserver.csr" -CA "${pki}/ca.crt" -CAkey "${pki}/ca.key" \
    -CAcreateserial -days 30 -extfile "${pki}/apiserver.ext" -out "${pki}/apiserver.crt" 2>/dev/null
  # Client certificate of the API server towards aggregated APIs; configuring the request-header
  # CA also spares the controllers' delegated authentication a complaint every few seconds.
  printf 'extendedKeyUsage=clientAuth\n' >"${pki}/front-proxy-client.ext"
  openssl req -newkey rsa:2048 -nodes -subj "/CN=front-proxy-client" \
    -keyout "${pki}/front-proxy-client.key" -out "${pki}/front-proxy-client.csr" 2>/dev/null
  openssl x509 -req -in "${pki}/front-proxy-client.csr" -CA "${pki}/ca.crt" -CAkey "${pki}/ca.key" \
    -CAcreateserial -days 30 -extfile "${pki}/front-proxy-client.ext" \
    -out "${pki}/front-proxy-client.crt" 2>/dev/null
  # The API server's identity towards the real node's kubelet (logs, exec, port-forward).
  printf 'extendedKeyUsage=clientAuth\n' >"${pki}/kubelet-client.ext"
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
    -keyout "${pki}/kubelet-client.key" -out "${pki}/kubelet-client.csr" 2>/dev/null
  openssl x509 -req -in "${pki}/kubelet-client.csr" -CA "${pki}/ca.crt" -CAkey "${pki}/ca.key" \
    -CAcreateserial -days 30 -extfile "${pki}/kubelet-client.ext" \
    -out "${pki}/kubelet-client.crt" 2>/dev/null
  openssl genrsa -out "${pki}/sa.key" 2048 2>/dev/null
  openssl rsa -in "${pki}/sa.key" -pubout -out "${pki}/sa.pub" 2>/dev/null
  chmod 600 "${pki}"/*.key
}

# One static token per identity: admin (system:masters), the two controllers, and the node.
write_tokens_and_kubeconfigs() {
  step "writing static tokens and kubeconfigs"
  local tokens="${STATE_DIR}/pki/tokens.csv"
  : >"${tokens}"
  chmod 600 "${tokens}"
  write_identity admin admin '"system:masters"'
  write_identity kube-controller-manager system:kube-controller-manager ''
  write_identity kube-scheduler system:kube-scheduler ''
  if [[ "${NODE_KIND}" == real ]]; then
    write_identity real-node "system:node:${NODE_NAME}" '"system:nodes"'
    write_identity kube-proxy system:kube-proxy ''
    write_identity coredns system:coredns ''
  else
    write_identity hollow-node "system:node:${NODE_NAME}" '"system:nodes"'
  fi
}

write_identity() {
  local name="$1" user="$2" groups="$3" token
  token="$(openssl rand -hex 16)"
  printf '%s,%s,%s,%s\n' "${token}" "${user}" "${user}" "${groups}" >>"${STATE_DIR}/pki/tokens.csv"
  cat >"${STATE_DIR}/${name}.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dstream-local
  cluster:
    server: ${APISERVER_URL}
    certificate-authority: ${STATE_DIR}/pki/ca.crt
users:
- name: ${name}
  user:
    token: ${token}
contexts:
- name: dstream-local
  context:
    cluster: dstream-local
    user: ${name}
current-context: dstream-local
EOF
  chmod 600 "${STATE_DIR}/${name}.kubeconfig"
}

# ---------------------------------------------------------------------------------------------
# Processes

pid_file() { echo "${STATE_DIR}/pids/$1.pid"; }

# Exists and is not a zombie: a stopped component is re-parented to init, which may take a while
# to reap it.
process_running() {
  local state
  state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ -n "${state}" && "${state}" != Z ]]
}

# Alive and still the program we started (guards against a recycled PID).
component_pid() {
  local name="$1" file pid exe
  file="$(pid_file "${name}")"
  [[ -f "${file}" ]] || return 1
  read -r pid exe <"${file}"
  [[ -n "${pid}" ]] && process_running "${pid}" || return 1
  [[ "$(readlink "/proc/${pid}/exe" 2>/dev/null)" == "${exe}" ]] || return 1
  echo "${pid}"
}

# start_component NAME BINARY ARGS... : detached from this shell, output to logs/NAME.log.
start_component() {
  local name="$1" binary="$2"
  shift 2
  local exe
  exe="$(readlink -f "${binary}")"
  [[ -x "${exe}" ]] || die "${binary} not found"
  step "starting ${name}"
  # setsid: own session, so a Ctrl-C or a dying caller does not take the cluster with it.
  # AWS_EC2_METADATA_DISABLED: the kubelet's in-tree ECR credential provider would otherwise probe
  # the EC2 metadata address (169.254.169.254) at start; nothing here may leave loopback.
  # 8>&- 9>&-: the lock fds (LOCK_FDS) stay with this script, or the cluster would hold the locks.
  TMPDIR="${STATE_DIR}/tmp" AWS_EC2_METADATA_DISABLED=true \
    setsid "${exe}" "$@" </dev/null >>"${STATE_DIR}/logs/${name}.log" 2>&1 8>&- 9>&- &
  local pid=$!
  echo "${pid} ${exe}" >"$(pid_file "${name}")"
  # Until the background shell has exec'd setsid and setsid the binary, /proc/PID/exe is bash's
  # and component_pid would call the component dead (seen on a loaded machine).
  local tries
  for ((tries = 0; tries < 100; tries++)); do
    [[ "$(readlink "/proc/${pid}/exe" 2>/dev/null)" == "${exe}" ]] && return 0
    process_running "${pid}" || return 0
    sleep 0.1
  done
}

# wait_for WHAT CHECK-COMMAND... : poll every second until the check passes or the timeout.
wait_for() {
  local what="$1" component="$2"
  shift 2
  step "waiting for ${what} (timeout ${READY_TIMEOUT}s)"
  local deadline=$((SECONDS + READY_TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if ! component_pid "${component}" >/dev/null; then
      die "${component} exited; last lines of ${STATE_DIR}/logs/${component}.log:
$(tail -n 20 "${STATE_DIR}/logs/${component}.log" 2>/dev/null)"
    fi
    if ((SECONDS >= deadline)); then
      die "${what} not ready after ${READY_TIMEOUT}s; last lines of ${STATE_DIR}/logs/${component}.log:
$(tail -n 20 "${STATE_DIR}/logs/${component}.log" 2>/dev/null)"
    fi
    sleep 1
  done
  log "${what} ready"
}

port_is_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

check_ports_free() {
  local port node_ports=("${HOLLOW_KUBELET_PORT}")
  [[ "${NODE_KIND}" == real ]] &&
    node_ports=("${KUBELET_HEALTHZ_PORT}" "${KUBE_PROXY_METRICS_PORT}" "${KUBE_PROXY_HEALTHZ_PORT}"
      "${COREDNS_READY_PORT}")
  for port in "${ETCD_CLIENT_PORT}" "${ETCD_PEER_PORT}" "${APISERVER_PORT}" \
    "${CONTROLLER_MANAGER_PORT}" "${SCHEDULER_PORT}" "${node_ports[@]}"; do
    port_is_free "${port}" || die "port 127.0.0.1:${port} is in use by a process this script did \
not start (another etcd or Kubernetes?); stop it first"
  done
}

kubectl_bin() {
  if [[ -x "${BIN_DIR}/kubectl" ]]; then
    echo "${BIN_DIR}/kubectl"
  else
    command -v kubectl || die "no kubectl (neither ${BIN_DIR}/kubectl nor on PATH)"
  fi
}

kubectl_admin() {
  "$(kubectl_bin)" --kubeconfig "${STATE_DIR}/admin.kubeconfig" "$@"
}

# ---- health checks (each prints nothing, succeeds when healthy) ----

etcd_healthy() {
  curl -fsS --max-time 2 "http://127.0.0.1:${ETCD_CLIENT_PORT}/health" | grep -q '"health":"true"'
}

apiserver_ready() {
  [[ "$(kubectl_admin get --raw /readyz --request-timeout=2s 2>/dev/null)" == ok ]]
}

healthz_ok() {
  [[ "$(curl -ksS --max-time 2 "https://127.0.0.1:$1/healthz" 2>/dev/null)" == ok ]]
}

controller_manager_healthy() { healthz_ok "${CONTROLLER_MANAGER_PORT}"; }
scheduler_healthy() { healthz_ok "${SCHEDULER_PORT}"; }

# The token controller of kube-controller-manager is working once `default` has its ServiceAccount
# with a token secret; pods cannot be created in a namespace before that.
default_service_account_ready() {
  [[ -n "$(kubectl_admin -n default get serviceaccount default -o 'jsonpath={.secrets[0].name}' \
    2>/dev/null)" ]]
}

node_ready() {
  [[ "$(kubectl_admin get node "${NODE_NAME}" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

# ---- the components ----

start_etcd() {
  start_component etcd /usr/bin/etcd \
    --name dstream \
    --data-dir "${STATE_DIR}/etcd" \
    --listen-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
    --advertise-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
    --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-cluster "dstream=http://127.0.0.1:${ETCD_PEER_PORT}" \
    --quota-backend-bytes 2147483648
  wait_for "etcd on 127.0.0.1:${ETCD_CLIENT_PORT}" etcd etcd_healthy
}

# With the hollow node nothing but loopback clients exist, and the `kubernetes` Service keeps no
# endpoints. With the real node the API server listens on the pod bridge and the `kubernetes`
# Service points there (kube-proxy routes its ClusterIP for pods); it reaches the kubelet with a
# client certificate.
apiserver_node_flags() {
  if [[ "${NODE_KIND}" == real ]]; then
    echo --endpoint-reconciler-type lease \
      --kubelet-client-certificate "${STATE_DIR}/pki/kubelet-client.crt" \
      --kubelet-client-key "${STATE_DIR}/pki/kubelet-client.key"
  else
    echo --endpoint-reconciler-type none
  fi
}

# Every list and watch request, with its URI and user (Metadata level: no bodies), so that tests
# can see what a client asked the API server for (say, that a watch carried a labelSelector).
write_audit_policy() {
  cat >"${STATE_DIR}/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["list", "watch"]
  - level: None
EOF
}

start_apiserver() {
  local pki="${STATE_DIR}/pki" node_flags
  read -r -a node_flags <<<"$(apiserver_node_flags)"
  write_audit_policy
  start_component kube-apiserver "${BIN_DIR}/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
    --bind-address "${APISERVER_HOST}" \
    --advertise-address "${APISERVER_HOST}" \
    --secure-port "${APISERVER_PORT}" \
    --insecure-port 0 \
    --cert-dir "${pki}" \
    --tls-cert-file "${pki}/apiserver.crt" \
    --tls-private-key-file "${pki}/apiserver.key" \
    --client-ca-file "${pki}/ca.crt" \
    --token-auth-file "${pki}/tokens.csv" \
    --requestheader-client-ca-file "${pki}/ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User \
    --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "${pki}/front-proxy-client.crt" \
    --proxy-client-key-file "${pki}/front-proxy-client.key" \
    --authorization-mode Node,RBAC \
    --service-account-key-file "${pki}/sa.pub" \
    --service-account-signing-key-file "${pki}/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range 10.96.0.0/24 \
    "${node_flags[@]}" \
    --kubelet-preferred-address-types InternalIP \
    --allow-privileged=true \
    --audit-policy-file "${STATE_DIR}/audit-policy.yaml" \
    --audit-log-path "${STATE_DIR}/logs/audit.log" \
    --audit-log-maxsize 200 \
    --audit-log-maxbackup 1 \
    --profiling=false \
    --v 1
  wait_for "kube-apiserver on ${APISERVER_URL} (/readyz)" kube-apiserver apiserver_ready
}

start_controller_manager() {
  local pki="${STATE_DIR}/pki" kubeconfig="${STATE_DIR}/kube-controller-manager.kubeconfig"
  mkdir -p "${pki}/kube-controller-manager"
  start_component kube-controller-manager "${BIN_DIR}/kube-controller-manager" \
    --kubeconfig "${kubeconfig}" \
    --authentication-kubeconfig "${kubeconfig}" \
    --authorization-kubeconfig "${kubeconfig}" \
    --bind-address 127.0.0.1 \
    --secure-port "${CONTROLLER_MANAGER_PORT}" \
    --port 0 \
    --cert-dir "${pki}/kube-controller-manager" \
    --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file "${pki}/sa.key" \
    --root-ca-file "${pki}/ca.crt" \
    --cluster-signing-cert-file "${pki}/ca.crt" \
    --cluster-signing-key-file "${pki}/ca.key" \
    --profiling=false \
    --v 1
  wait_for "kube-controller-manager (/healthz on :${CONTROLLER_MANAGER_PORT})" \
    kube-controller-manager controller_manager_healthy
}

start_scheduler() {
  local pki="${STATE_DIR}/pki" kubeconfig="${STATE_DIR}/kube-scheduler.kubeconfig"
  mkdir -p "${pki}/kube-scheduler"
  start_component kube-scheduler "${BIN_DIR}/kube-scheduler" \
    --kubeconfig "${kubeconfig}" \
    --authentication-kubeconfig "${kubeconfig}" \
    --authorization-kubeconfig "${kubeconfig}" \
    --bind-address 127.0.0.1 \
    --secure-port "${SCHEDULER_PORT}" \
    --port 0 \
    --cert-dir "${pki}/kube-scheduler" \
    --leader-elect=false \
    --profiling=false \
    --v 1
  wait_for "kube-scheduler (/healthz on :${SCHEDULER_PORT})" kube-scheduler scheduler_healthy
}

start_hollow_node() {
  start_component hollow-node "${BIN_DIR}/kubemark" \
    --morph kubelet \
    --name "${NODE_NAME}" \
    --kubeconfig "${STATE_DIR}/hollow-node.kubeconfig" \
    --kubelet-port "${HOLLOW_KUBELET_PORT}" \
    --kubelet-read-only-port 0 \
    --v 1
  wait_for "hollow node ${NODE_NAME} (condition Ready)" hollow-node node_ready
}

# ---------------------------------------------------------------------------------------------
# Subcommands

all_components_alive() {
  local c
  for c in "${COMPONENTS[@]}"; do
    component_pid "${c}" >/dev/null || return 1
  done
}

# all_components_alive_of KIND: the same for a cluster with the other kind of node.
all_components_alive_of() {
  (
    set_node_kind "$1"
    all_components_alive
  )
}

cmd_up() {
  trap on_error ERR
  local started=$SECONDS
  local running
  running="$(recorded_node_kind)"
  if [[ "${running}" != "${NODE_KIND}" ]] && all_components_alive_of "${running}"; then
    die "a cluster with a ${running} node is up (${STATE_DIR}); \`bash $0 down\` it first"
  fi
  if all_components_alive && apiserver_ready; then
    log "already up (state: ${STATE_DIR})"
    print_ready
    return
  fi
  if [[ -d "${STATE_DIR}/pids" ]]; then
    log "a previous cluster in ${STATE_DIR} is partly down; stopping what is left of it"
    local wanted="${NODE_KIND}"
    set_node_kind "${running}"
    cmd_down
    set_node_kind "${wanted}"
  fi
  build_binaries
  install_apt_packages
  [[ "${NODE_KIND}" == real ]] && build_coredns
  step "checking that the ports are free"
  check_ports_free
  rm -rf "${STATE_DIR}"
  mkdir -p "${STATE_DIR}"/{pids,logs,tmp}
  echo "${NODE_KIND}" >"${STATE_DIR}/node-kind"
  UP_STARTED_COMPONENTS=true
  generate_pki
  write_tokens_and_kubeconfigs
  [[ "${NODE_KIND}" == real ]] && create_pod_network
  start_etcd
  start_apiserver
  start_controller_manager
  start_scheduler
  if [[ "${NODE_KIND}" == real ]]; then
    start_real_node
  else
    start_hollow_node
  fi
  wait_for "the default ServiceAccount (token controller)" kube-controller-manager \
    default_service_account_ready
  UP_STARTED_COMPONENTS=false
  log "cluster up in $((SECONDS - started))s"
  print_ready
}

print_ready() {
  echo "api: ${APISERVER_URL}"
  echo "node: ${NODE_NAME}"
  echo "kubeconfig: ${STATE_DIR}/admin.kubeconfig"
  echo "audit log: ${STATE_DIR}/logs/audit.log"
  echo "kubectl: $(kubectl_bin)"
}

# TERM, then KILL after a bounded wait.
stop_component() {
  local name="$1" pid i
  if pid="$(component_pid "${name}")"; then
    kill -TERM "${pid}" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      process_running "${pid}" || break
      sleep 0.1
    done
    if process_running "${pid}"; then
      log "${name} (pid ${pid}) ignored TERM for 10s; sending KILL"
      kill -KILL "${pid}" 2>/dev/null || true
    fi
    log "stopped ${name} (pid ${pid})"
  fi
  rm -f "$(pid_file "${name}")"
}

stop_components() {
  local i
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    [[ "${COMPONENTS[i]}" == containerd ]] && remove_pod_containers
    stop_component "${COMPONENTS[i]}"
  done
  if [[ "${NODE_KIND}" == real ]]; then
    clean_real_node
  else
    remove_hollow_kubelet_root
  fi
}

# kubemark makes its kubelet root dir under a hard-coded /tmp (not $TMPDIR) and logs its name.
remove_hollow_kubelet_root() {
  local log_file="${STATE_DIR}/logs/hollow-node.log" dir
  [[ -f "${log_file}" ]] || return 0
  { grep -o 'Using /tmp/hollow-kubelet\.[0-9]* as root dir' "${log_file}" || true; } |
    awk '{print $2}' |
    while read -r dir; do
      if [[ -d "${dir}" ]]; then
        rm -rf --one-file-system "${dir}"
        log "removed ${dir}"
      fi
    done
}

cmd_down() {
  stop_components
  if [[ -d "${STATE_DIR}" ]]; then
    rm -rf "${STATE_DIR}"
    log "removed ${STATE_DIR}"
  fi
}

cmd_env() {
  echo "export KUBECONFIG=${STATE_DIR}/admin.kubeconfig"
  echo "export PATH=${BIN_DIR}:\$PATH"
  if [[ "${NODE_KIND}" == real ]]; then
    # ctr and e2e/image/load.sh: the real node's containerd
    echo "export CONTAINERD_ADDRESS=$(containerd_socket)"
    echo "export CONTAINERD_NAMESPACE=k8s.io"
  fi
}

cmd_status() {
  local c pid any_alive=false
  for c in "${COMPONENTS[@]}"; do
    if pid="$(component_pid "${c}")"; then
      printf '%-24s running (pid %s)\n' "${c}" "${pid}"
      any_alive=true
    elif [[ -f "$(pid_file "${c}")" ]]; then
      printf '%-24s NOT running (pid file %s)\n' "${c}" "$(pid_file "${c}")"
    else
      printf '%-24s not started\n' "${c}"
    fi
  done
  if [[ -f "${STATE_DIR}/admin.kubeconfig" ]] && apiserver_ready; then
    echo "api: ${APISERVER_URL} ready"
  else
    echo "api: ${APISERVER_URL} not answering"
  fi
  if [[ "${any_alive}" == true ]] && all_components_alive; then
    return 0
  fi
  return 1
}

cmd_build() {
  trap on_error ERR
  build_binaries
  install_apt_packages
}

main() {
  case "${1:-}" in
  up | down) hold_lock "${STATE_DIR}.lock" "${LOCK_FDS[1]}" ;;
  esac
  if [[ "${1:-}" == up ]]; then
    case "${2:-}" in
    --real-node) set_node_kind real ;;
    "") set_node_kind "${DSTREAM_K8S_NODE:-hollow}" ;;
    *)
      echo "usage: $0 up [--real-node]" >&2
      exit 2
      ;;
    esac
  else
    set_node_kind "$(recorded_node_kind)"
  fi
  case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  env) cmd_env ;;
  status) cmd_status ;;
  build) cmd_build ;;
  *)
    echo "usage: $0 up [--real-node]|down|env|status|build" >&2
    exit 2
    ;;
  esac
}

main "$@"
