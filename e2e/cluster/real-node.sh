# shellcheck shell=bash
# The real node of `local.sh up --real-node` (sourced by local.sh, which defines log, die, step,
# start_component, component_pid, wait_for, write_identity, kubectl_admin and the paths).
#
# On this machine: containerd (Debian's, own config/root/state/socket under the state dir, CRI
# plugin with restrict_oom_score_adj, runc, overlayfs), a CNI bridge `cni0` with host-local IPAM
# on 10.244.0.0/24 (the bridge address 10.244.0.1 is also the node IP and where the API server
# listens, so pods reach it), kubelet (cgroupfs) and kube-proxy (iptables mode, for ClusterIPs such
# as the `kubernetes` Service) and CoreDNS, the cluster DNS (Service names under cluster.local, from
# the API server; any other name fails at once: pods reach no other name server). Forwarding from the bridge to anything but the bridge is dropped, so pods reach only each other
# and this machine. See shared/notes/offline-kubernetes.md.

readonly REAL_NODE_NAME=dstream-node
readonly REAL_NODE_IP=10.244.0.1
readonly POD_SUBNET=10.244.0.0/24
readonly POD_BRIDGE=cni0
readonly KUBELET_PORT=10250
readonly KUBELET_HEALTHZ_PORT=10248
readonly KUBE_PROXY_METRICS_PORT=10249
readonly KUBE_PROXY_HEALTHZ_PORT=10256
# CoreDNS, built from its Go module with Debian's Go 1.19 (as the Kubernetes binaries are) and cached
# beside them: 1.10.1 is the last release whose kubernetes plugin watches EndpointSlices
# discovery.k8s.io/v1beta1, the only version Kubernetes 1.20 serves (1.11 needs v1, Kubernetes 1.21).
readonly COREDNS_VERSION=v1.10.1
readonly COREDNS_MODULE=github.com/coredns/coredns
readonly CLUSTER_DOMAIN=cluster.local
readonly CLUSTER_DNS_IP="${REAL_NODE_IP}" # on the bridge, where pods reach this machine
readonly COREDNS_READY_PORT=8181          # its `ready` plugin, on 127.0.0.1
readonly KUBELET_ROOT=/var/lib/kubelet
readonly CNI_STATE_DIR=/var/lib/cni
readonly CNI_BIN_DIR=/usr/lib/cni
readonly POD_LOG_DIRS=(/var/log/pods /var/log/containers)
# containerd 1.6 puts shim sockets under /run/containerd/s whatever its configured state dir.
readonly CONTAINERD_RUN_DIR=/run/containerd
readonly PAUSE_VERSION=3.4
readonly PAUSE_IMAGE="dstream.local/pause:${PAUSE_VERSION}"
readonly ISOLATION_COMMENT=dstream-pods-stay-local
# Kernel settings the node changes; their previous values are restored by `down`.
readonly SAVED_SYSCTLS=(net.ipv4.ip_forward net.ipv4.conf.all.route_localnet
  net.bridge.bridge-nf-call-iptables)

containerd_dir() { echo "${STATE_DIR}/containerd"; }
containerd_socket() { echo "$(containerd_dir)/containerd.sock"; }
ctr_k8s() { ctr --address "$(containerd_socket)" --namespace k8s.io "$@"; }

# ---------------------------------------------------------------------------------------------
# The sandbox ("pause") image, from the tree's build/pause/linux/pause.c, as a docker-archive.

pause_archive() { echo "${CACHE_DIR}/images/pause-${PAUSE_VERSION}.tar"; }

build_pause_image() {
  local archive
  archive="$(pause_archive)"
  [[ -s "${archive}" ]] && return
  step "building the pause image ${PAUSE_IMAGE} (gcc -static ${SRC_DIR}/build/pause/linux/pause.c)"
  [[ -f "${SRC_DIR}/build/pause/linux/pause.c" ]] || fetch_kubernetes_source
  local work
  work="$(mktemp -d)"
  mkdir -p "${work}/rootfs" "$(dirname "${archive}")"
  gcc -Os -Wall -Werror -static -DVERSION="v${PAUSE_VERSION}-dstream" \
    -o "${work}/rootfs/pause" "${SRC_DIR}/build/pause/linux/pause.c" ||
    die "compiling pause.c failed"
  write_docker_archive "${work}" "${PAUSE_IMAGE}" '["/pause"]' "${archive}"
  rm -rf "${work}"
}

# write_docker_archive WORKDIR REF ENTRYPOINT-JSON OUT: WORKDIR/rootfs as a one-layer image that
# `ctr images import` accepts (layer tar, config with its diff_id, manifest.json with RepoTags).
write_docker_archive() {
  local work="$1" ref="$2" entrypoint="$3" out="$4" diff_id config_id
  tar --numeric-owner --owner=0 --group=0 -C "${work}/rootfs" -cf "${work}/layer.tar" .
  diff_id="$(sha256sum "${work}/layer.tar" | cut -d' ' -f1)"
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "${entrypoint}" "${diff_id}" >"${work}/config.json"
  config_id="$(sha256sum "${work}/config.json" | cut -d' ' -f1)"
  mv "${work}/config.json" "${work}/${config_id}.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' \
    "${config_id}" "${ref}" >"${work}/manifest.json"
  tar -C "${work}" -cf "${out}.tmp" manifest.json "${config_id}.json" layer.tar
  mv "${out}.tmp" "${out}"
}

# ---------------------------------------------------------------------------------------------
# Host network: the bridge exists before the API server starts (it listens on the bridge address).

save_sysctls() {
  local name
  for name in "${SAVED_SYSCTLS[@]}"; do
    [[ -e "/proc/sys/${name//.//}" ]] && printf '%s=%s\n' "${name}" "$(sysctl -n "${name}")"
  done >"${STATE_DIR}/saved-sysctls"
}

restore_sysctls() {
  local file="${STATE_DIR}/saved-sysctls" line
  [[ -f "${file}" ]] || return 0
  while read -r line; do
    sysctl -q -w "${line}" >/dev/null 2>&1 || log "could not restore sysctl ${line}"
  done <"${file}"
  rm -f "${file}"
}

isolation_rule() {
  iptables -w 5 "$1" FORWARD -i "${POD_BRIDGE}" ! -o "${POD_BRIDGE}" \
    -m comment --comment "${ISOLATION_COMMENT}" -j DROP
}

create_pod_network() {
  step "creating the pod bridge ${POD_BRIDGE} (${REAL_NODE_IP}/24) and its isolation rule"
  ip link show "${POD_BRIDGE}" >/dev/null 2>&1 &&
    die "a ${POD_BRIDGE} interface already exists (left over? \`bash $0 down\` removes ours)"
  save_sysctls
  ip link add "${POD_BRIDGE}" type bridge
  ip addr add "${REAL_NODE_IP}/24" dev "${POD_BRIDGE}"
  ip link set "${POD_BRIDGE}" up
  isolation_rule -I
  mkdir -p "${STATE_DIR}/cni/net.d"
  cat >"${STATE_DIR}/cni/net.d/10-dstream.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "dstream-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "${POD_BRIDGE}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "${POD_SUBNET}", "gateway": "${REAL_NODE_IP}"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  # The resolv.conf of pods that do not use the cluster DNS (dnsPolicy Default): a name server
  # that is not there fails lookups at once instead of timing out.
  printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"${STATE_DIR}/pod-resolv.conf"
}

remove_pod_network() {
  if ip link show "${POD_BRIDGE}" >/dev/null 2>&1; then
    ip link delete "${POD_BRIDGE}"
    log "removed ${POD_BRIDGE}"
  fi
  while isolation_rule -C 2>/dev/null; do isolation_rule -D; done
  restore_sysctls
}

# ---------------------------------------------------------------------------------------------
# containerd

write_containerd_config() {
  local dir
  dir="$(containerd_dir)"
  mkdir -p "${dir}/root" "${dir}/state"
  cat >"${dir}/config.toml" <<EOF
version = 2
root = "${dir}/root"
state = "${dir}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$(containerd_socket)"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PAUSE_IMAGE}"
  # Writing oom_score_adj below the daemon's own is not permitted here (no CAP_SYS_RESOURCE).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${CNI_BIN_DIR}"
    conf_dir = "${STATE_DIR}/cni/net.d"
EOF
}

containerd_ready() { ctr_k8s version; }

start_containerd() {
  write_containerd_config
  start_component containerd /usr/bin/containerd --config "$(containerd_dir)/config.toml"
  wait_for "containerd on $(containerd_socket)" containerd containerd_ready
}

# import_image ARCHIVE: a docker-archive into containerd's k8s.io namespace (what the kubelet sees).
import_image() {
  step "importing $1 into containerd"
  ctr_k8s images import "$1" >/dev/null || die "ctr images import $1 failed"
}

# ---------------------------------------------------------------------------------------------
# kubelet and kube-proxy

write_kubelet_config() {
  local pki="${STATE_DIR}/pki"
  cat >"${STATE_DIR}/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ${REAL_NODE_IP}
port: ${KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${KUBELET_HEALTHZ_PORT}
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: ${pki}/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failSwapOn: false
resolvConf: ${STATE_DIR}/pod-resolv.conf
# Pods (dnsPolicy ClusterFirst) get this name server and the search path
# <namespace>.svc.cluster.local svc.cluster.local cluster.local.
clusterDNS: [${CLUSTER_DNS_IP}]
clusterDomain: ${CLUSTER_DOMAIN}
serializeImagePulls: false
# Images come from local archives (no registry): never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}
EOF
}

start_kubelet() {
  write_kubelet_config
  mkdir -p "${STATE_DIR}/pki/kubelet"
  start_component kubelet "${BIN_DIR}/kubelet" \
    --config "${STATE_DIR}/kubelet-config.yaml" \
    --kubeconfig "${STATE_DIR}/real-node.kubeconfig" \
    --container-runtime remote \
    --container-runtime-endpoint "unix://$(containerd_socket)" \
    --pod-infra-container-image "${PAUSE_IMAGE}" \
    --hostname-override "${REAL_NODE_NAME}" \
    --node-ip "${REAL_NODE_IP}" \
    --root-dir "${KUBELET_ROOT}" \
    --cert-dir "${STATE_DIR}/pki/kubelet" \
    --v 1
  wait_for "node ${REAL_NODE_NAME} (condition Ready)" kubelet node_ready
}

kube_proxy_healthy() { curl -fsS --max-time 2 "http://127.0.0.1:${KUBE_PROXY_HEALTHZ_PORT}/healthz"; }

# The conntrack flags at 0 leave the kernel's settings alone (changing them needs privileges that
# are not granted here).
start_kube_proxy() {
  start_component kube-proxy "${BIN_DIR}/kube-proxy" \
    --kubeconfig "${STATE_DIR}/kube-proxy.kubeconfig" \
    --hostname-override "${REAL_NODE_NAME}" \
    --bind-address "${REAL_NODE_IP}" \
    --cluster-cidr "${POD_SUBNET}" \
    --nodeport-addresses "${POD_SUBNET}" \
    --proxy-mode iptables \
    --conntrack-max-per-core 0 \
    --conntrack-tcp-timeout-established 0 \
    --conntrack-tcp-timeout-close-wait 0 \
    --metrics-bind-address "127.0.0.1:${KUBE_PROXY_METRICS_PORT}" \
    --healthz-bind-address "127.0.0.1:${KUBE_PROXY_HEALTHZ_PORT}" \
    --v 1
  wait_for "kube-proxy (/healthz on :${KUBE_PROXY_HEALTHZ_PORT})" kube-proxy kube_proxy_healthy
}

# ---------------------------------------------------------------------------------------------
# Cluster DNS: CoreDNS on the bridge address, reading Services and EndpointSlices from the API
# server as system:coredns (the permissions of the ClusterRole below, as in a kubeadm cluster).

coredns_binary() { echo "${CACHE_DIR}/coredns-${COREDNS_VERSION}/bin/coredns"; }

# `go install` of the release's module (from the Go module proxy, cached beside the binary), under
# a lock so that two runs do not build into one directory.
build_coredns() {
  local binary dir
  binary="$(coredns_binary)"
  [[ -x "${binary}" ]] && return
  dir="$(dirname "$(dirname "${binary}")")"
  mkdir -p "${dir}"
  step "building CoreDNS ${COREDNS_VERSION} (go install ${COREDNS_MODULE}; log: ${dir}/build.log)"
  (
    flock -w "${LOCK_TIMEOUT}" 7 || exit 1
    [[ -x "${binary}" ]] && exit 0
    env -u GOFLAGS -u GOROOT GOPATH="${dir}/go" GOMODCACHE="${dir}/go/mod" \
      GOCACHE="${dir}/go/cache" GOBIN="${dir}/bin" CGO_ENABLED=0 GOFLAGS=-modcacherw \
      PATH="${GOROOT_119}/bin:${PATH}" \
      go install "${COREDNS_MODULE}@${COREDNS_VERSION}" >"${dir}/build.log" 2>&1
  ) 7>"${dir}/.build.lock" ||
    die "building CoreDNS failed, last lines of ${dir}/build.log:
$(tail -n 20 "${dir}/build.log")"
}

write_coredns_config() {
  kubectl_admin apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:coredns"}
EOF
  # Cluster names from the API server; any other name NXDOMAIN at once (no upstream here).
  cat >"${STATE_DIR}/Corefile" <<EOF
${CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {
  bind ${CLUSTER_DNS_IP}
  errors
  ready 127.0.0.1:${COREDNS_READY_PORT}
  kubernetes ${CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {
    kubeconfig ${STATE_DIR}/coredns.kubeconfig dstream-local
    ttl 5
  }
}
. {
  bind ${CLUSTER_DNS_IP}
  template ANY ANY {
    rcode NXDOMAIN
  }
}
EOF
}

coredns_ready() { curl -fsS --max-time 2 "http://127.0.0.1:${COREDNS_READY_PORT}/ready"; }

start_coredns() {
  write_coredns_config
  start_component coredns "$(coredns_binary)" -conf "${STATE_DIR}/Corefile"
  wait_for "CoreDNS on ${CLUSTER_DNS_IP}:53 (/ready on :${COREDNS_READY_PORT})" coredns coredns_ready
}

start_real_node() {
  build_pause_image
  start_containerd
  import_image "$(pause_archive)"
  start_coredns
  start_kubelet
  start_kube_proxy
}

# ---------------------------------------------------------------------------------------------
# Teardown: every container, mount, namespace, rule and directory the node made.

# While containerd still runs: kill and delete every container (pod sandboxes included), so that
# their shims exit; then TERM any shim left, by the pid it recorded.
remove_pod_containers() {
  component_pid containerd >/dev/null || return 0
  local ids id
  ids="$(ctr_k8s tasks ls -q 2>/dev/null)" || ids=""
  for id in ${ids}; do ctr_k8s tasks kill -s SIGKILL "${id}" >/dev/null 2>&1 || true; done
  for id in ${ids}; do ctr_k8s tasks delete -f "${id}" >/dev/null 2>&1 || true; done
  ids="$(ctr_k8s containers ls -q 2>/dev/null)" || ids=""
  for id in ${ids}; do ctr_k8s containers delete "${id}" >/dev/null 2>&1 || true; done
  [[ -n "${ids}" ]] && log "removed $(wc -w <<<"${ids}") containers"
  stop_leftover_shims
}

stop_leftover_shims() {
  local file pid
  for file in "$(containerd_dir)"/state/io.containerd.runtime.v2.task/*/*/shim.pid; do
    [[ -f "${file}" ]] || continue
    pid="$(<"${file}")"
    if process_running "${pid}" &&
      [[ "$(readlink "/proc/${pid}/exe" 2>/dev/null)" == */containerd-shim-runc-v2 ]]; then
      kill -TERM "${pid}" 2>/dev/null || true
      log "stopped shim (pid ${pid})"
    fi
  done
}

# kill_cgroup_processes DIR: SIGKILL whatever still runs in a pod cgroup tree (by pid).
kill_cgroup_processes() {
  local pid
  while read -r pid; do
    kill -KILL "${pid}" 2>/dev/null || true
  done < <(find "$1" -name cgroup.procs -exec cat {} + 2>/dev/null)
}

remove_kubepods_cgroups() {
  local dir i
  for dir in /sys/fs/cgroup/*/kubepods; do
    [[ -d "${dir}" ]] || continue
    kill_cgroup_processes "${dir}"
    for ((i = 0; i < 50; i++)); do
      find "${dir}" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [[ -d "${dir}" ]] || break
      sleep 0.1
    done
    [[ -d "${dir}" ]] && log "could not remove ${dir}"
  done
  return 0
}

# unmount_under DIR: every mount point at or below DIR, deepest first (the kubelet bind-mounts its
# root dir onto itself).
unmount_under() {
  local target
  awk -v dir="$1" '$2 == dir || index($2, dir "/") == 1 {print $2}' /proc/self/mounts | sort -r |
    while read -r target; do
      umount "${target}" 2>/dev/null || umount -l "${target}" 2>/dev/null ||
        log "could not unmount ${target}"
    done
}

# Network namespaces of pod sandboxes, which the CRI plugin names cni-<uuid>.
remove_pod_netns() {
  local ns
  for ns in /run/netns/cni-*; do
    [[ -e "${ns}" ]] || continue
    ip netns delete "${ns##*/}" 2>/dev/null || { umount "${ns}" 2>/dev/null; rm -f "${ns}"; }
  done
}

# The KUBE-* chains of kube-proxy and the kubelet, and the rules of built-in chains jumping there.
# (`kube-proxy --cleanup` stops at its ipvs part without the ipset tool.)
remove_kube_iptables_chains() {
  local table rule chain
  for table in filter nat mangle; do
    iptables-save -t "${table}" |
      awk '/^-A (INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) .*-j KUBE-/' | sed 's/^-A/-D/' |
      while read -r rule; do
        eval "iptables -w 5 -t ${table} ${rule}" || log "could not delete ${table}: ${rule}"
      done
    for chain in $(iptables-save -t "${table}" | awk '/^:KUBE-/ {print substr($1, 2)}'); do
      iptables -w 5 -t "${table}" -F "${chain}"
    done
    for chain in $(iptables-save -t "${table}" | awk '/^:KUBE-/ {print substr($1, 2)}'); do
      iptables -w 5 -t "${table}" -X "${chain}"
    done
  done
}

# After the components stopped: what a stopped node leaves behind.
clean_real_node() {
  remove_kubepods_cgroups
  unmount_under "${KUBELET_ROOT}"
  unmount_under "$(containerd_dir)"
  remove_pod_netns
  remove_kube_iptables_chains
  remove_pod_network
  rm -rf --one-file-system "${KUBELET_ROOT}" "${CNI_STATE_DIR}" "$(containerd_dir)" "${POD_LOG_DIRS[@]}"
  # Shim sockets; only when no other containerd (one with the default socket) is running.
  [[ -S "${CONTAINERD_RUN_DIR}/containerd.sock" ]] || rm -rf "${CONTAINERD_RUN_DIR}"
  log "removed the real node's state (${KUBELET_ROOT}, ${CNI_STATE_DIR}, containerd, cgroups)"
}
