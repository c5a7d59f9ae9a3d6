#!/usr/bin/env bash
# Loads a docker-archive image tarball (from build.sh beside this file) into containerd's k8s.io
# namespace, where the kubelet's CRI finds it, and checks that every tag in the archive is listed.
#
#   e2e/image/load.sh SOCKET TARBALL        into the containerd serving SOCKET
#   e2e/image/load.sh --standalone TARBALL  into a throw-away containerd (own config, root, state
#                                           and socket in a temporary directory, CRI plugin off),
#                                           stopped by PID and removed afterwards
#
# Prints the image names found in containerd on stdout; progress on stderr.
# Environment: DSTREAM_LOAD_TIMEOUT seconds for the import (default 900).
set -euo pipefail

readonly NAMESPACE=k8s.io
readonly IMPORT_TIMEOUT="${DSTREAM_LOAD_TIMEOUT:-900}"
readonly START_TIMEOUT=60

STEP="start"
CONTAINERD_PID=""
TMP_DIR=""

say() { printf '[load %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
  say "$*"
  exit 1
}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

on_exit() {
  local rc=$?
  trap - EXIT
  stop_containerd
  remove_tmp
  [ "${rc}" -eq 0 ] || say "FAILED at step '${STEP}' (exit ${rc})"
  exit "${rc}"
}

# "docker.io/library/dstream:0.1.0", one per line, as the archive's manifest.json tags them.
archive_tags() {
  tar -xOf "$1" manifest.json | python3 -c '
import json, sys
for image in json.load(sys.stdin):
    for tag in image.get("RepoTags") or []:
        name = tag if "/" in tag.split(":")[0] else "library/" + tag
        first = name.split("/")[0]
        if "." not in first and ":" not in first and first != "localhost":
            name = "docker.io/" + name
        print(name)'
}

# import_image SOCKET TARBALL: imports, then fails unless each archive tag is listed.
import_image() {
  local socket="$1" tarball="$2" started="${SECONDS}" listed tag
  STEP="import ${tarball}"
  [ -S "${socket}" ] || die "no containerd socket at ${socket}"
  [ -s "${tarball}" ] || die "no image tarball at ${tarball}"
  say "importing ${tarball} ($(du -h "${tarball}" | cut -f1)) into ${socket} namespace ${NAMESPACE}"
  timeout "${IMPORT_TIMEOUT}" ctr -a "${socket}" -n "${NAMESPACE}" images import "${tarball}" >&2
  STEP="check the image is listed"
  listed="$(ctr -a "${socket}" -n "${NAMESPACE}" images ls -q)"
  while read -r tag; do
    grep -qxF "${tag}" <<<"${listed}" || die "${tag} is not listed after the import"
    echo "${tag}"
  done < <(archive_tags "${tarball}")
  say "imported in $((SECONDS - started))s"
}

start_containerd() {
  STEP="start a temporary containerd"
  command -v containerd >/dev/null || die "containerd is not installed (apt-get install containerd)"
  TMP_DIR="$(mktemp -d /tmp/dstream-containerd.XXXXXX)"
  SOCKET="${TMP_DIR}/containerd.sock"
  cat >"${TMP_DIR}/config.toml" <<EOF
version = 2
root = "${TMP_DIR}/root"
state = "${TMP_DIR}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "${SOCKET}"
[ttrpc]
  address = "${SOCKET}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "${TMP_DIR}/opt"
EOF
  containerd --config "${TMP_DIR}/config.toml" >"${TMP_DIR}/containerd.log" 2>&1 &
  CONTAINERD_PID=$!
  local waited=0
  until ctr -a "${SOCKET}" version >/dev/null 2>&1; do
    kill -0 "${CONTAINERD_PID}" 2>/dev/null || {
      tail -n 20 "${TMP_DIR}/containerd.log" >&2
      die "containerd exited"
    }
    [ "${waited}" -lt "${START_TIMEOUT}" ] || die "containerd not serving ${SOCKET} after ${START_TIMEOUT}s"
    sleep 1
    waited=$((waited + 1))
  done
  say "containerd pid ${CONTAINERD_PID} on ${SOCKET}"
}

stop_containerd() {
  [ -n "${CONTAINERD_PID}" ] || return 0
  kill -TERM "${CONTAINERD_PID}" 2>/dev/null || true
  local waited=0
  while kill -0 "${CONTAINERD_PID}" 2>/dev/null && [ "${waited}" -lt 30 ]; do
    sleep 1
    waited=$((waited + 1))
  done
  kill -KILL "${CONTAINERD_PID}" 2>/dev/null || true
  wait "${CONTAINERD_PID}" 2>/dev/null || true
  CONTAINERD_PID=""
}

# Snapshot mounts are transient, but a killed unpack could leave one behind.
remove_tmp() {
  [ -n "${TMP_DIR}" ] && [ -d "${TMP_DIR}" ] || return 0
  awk -v dir="${TMP_DIR}/" 'index($2, dir) == 1 { print $2 }' /proc/self/mounts | sort -r |
    while read -r mountpoint; do umount -l "${mountpoint}" || true; done
  rm -rf --one-file-system "${TMP_DIR}"
  TMP_DIR=""
}

main() {
  [ $# -eq 2 ] || usage
  trap on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  if [ "$1" = "--standalone" ]; then
    start_containerd
    import_image "${SOCKET}" "$2"
  else
    import_image "$1" "$2"
  fi
  STEP="done"
}

main "$@"
