#!/usr/bin/env bash
# Builds the project's image from the repository's own Dockerfile without any container registry:
#
#   e2e/image/build.sh [--output DIR]
#
#   1. base rootfs: Debian (bookworm) from `debootstrap --variant=minbase`, made to look like the
#      official slim image (apt/dpkg settings, no docs), kept as a tarball in the cache;
#   2. base image:  that rootfs imported into buildah's storage under the name the Dockerfile's FROM
#      resolves to (debian:bookworm-slim), so the Dockerfile is built unchanged;
#   3. image:       `buildah bud` of the Dockerfile (apt reaches Debian's archive, pip reaches PyPI);
#   4. archive:     `buildah push` to a docker-archive tarball tagged dstream:<version> (tag.sh: the
#      project's version), which `ctr -n k8s.io images import` loads (see load.sh beside this file).
#
# A cache hit skips the work: the base tarball is keyed by suite and variant, the image tarball by a
# hash of the Dockerfile, .dockerignore, pyproject.toml, every git-listed file the build context
# keeps (tracked and untracked-but-not-ignored, working-tree content), this script and the base.
# Progress goes to stderr; the only line on stdout is the path of the image tarball (or its copy
# in DIR/dstream-e2e.tar with --output DIR).
#
# Environment:
#   DSTREAM_IMAGE_CACHE           cache root (default /var/cache/dstream-image): base/, images/,
#                                 containers/ (buildah storage, keeps layers between builds), logs/
#   DSTREAM_IMAGE_MIRROR          Debian mirror (default: the one apt on this machine uses)
#   DSTREAM_IMAGE_SUITE           Debian suite of the base (default bookworm)
#   DSTREAM_IMAGE_LOCAL_CA_DIR    local CA certificates (*.crt) the base image trusts like this host
#                                 does, e.g. a TLS-intercepting egress proxy's (default
#                                 /usr/local/share/ca-certificates; empty: none)
#   DSTREAM_IMAGE_STORAGE_DRIVER  overlay or vfs (default: overlay if this kernel mounts it here)
#   DSTREAM_IMAGE_STEP_TIMEOUT    seconds any one step may take (default 2400)
#   DSTREAM_IMAGE_HEARTBEAT       seconds between "still building" lines (default 30)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly ROOT
readonly SELF="${ROOT}/e2e/image/build.sh"
readonly CACHE="${DSTREAM_IMAGE_CACHE:-/var/cache/dstream-image}"
readonly SUITE="${DSTREAM_IMAGE_SUITE:-bookworm}"
readonly VARIANT=minbase
readonly STEP_TIMEOUT="${DSTREAM_IMAGE_STEP_TIMEOUT:-2400}"
readonly HEARTBEAT="${DSTREAM_IMAGE_HEARTBEAT:-30}"
IMAGE_REF="$(bash "${ROOT}/e2e/image/tag.sh")"
readonly IMAGE_REF
readonly LOGS="${CACHE}/logs"
readonly STORAGE="${CACHE}/containers"
readonly LOCAL_CA_DIR="${DSTREAM_IMAGE_LOCAL_CA_DIR-/usr/local/share/ca-certificates}"

STEP="start"
STEP_PID=""
STEP_LOG=""
TMP_DIR=""
WORK_CONTAINER=""
BUILDAH=()

say() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
  say "$*"
  exit 1
}

on_exit() {
  local rc=$?
  trap - EXIT
  stop_step
  if [ -n "${WORK_CONTAINER}" ]; then
    "${BUILDAH[@]}" rm "${WORK_CONTAINER}" >/dev/null 2>&1 || true
  fi
  remove_tmp
  if [ "${rc}" -ne 0 ]; then
    if [ -n "${STEP_LOG}" ] && [ -s "${STEP_LOG}" ]; then
      say "last lines of ${STEP_LOG}:"
      tail -n 40 "${STEP_LOG}" >&2 || true
    fi
    say "FAILED at step '${STEP}' (exit ${rc})"
  fi
  exit "${rc}"
}

stop_step() {
  if [ -n "${STEP_PID}" ] && kill -0 "${STEP_PID}" 2>/dev/null; then
    kill -TERM "${STEP_PID}" 2>/dev/null || true
    wait "${STEP_PID}" 2>/dev/null || true
  fi
  STEP_PID=""
}

# run_step NAME COMMAND...: runs one long command under `timeout` (which signals the command's
# whole process group), output to logs/NAME.log, with a "still building" line every HEARTBEAT s.
run_step() {
  local name="$1" started="${SECONDS}" next="${HEARTBEAT}" rc=0
  shift
  STEP="${name}"
  STEP_LOG="${LOGS}/${name}.log"
  say "step ${name}: $* (log: ${STEP_LOG})"
  timeout --kill-after=30 "${STEP_TIMEOUT}" "$@" >"${STEP_LOG}" 2>&1 </dev/null &
  STEP_PID=$!
  while kill -0 "${STEP_PID}" 2>/dev/null; do
    sleep 2
    if [ $((SECONDS - started)) -ge "${next}" ]; then
      say "still building ($((SECONDS - started))s, ${name}): $(tail -n 1 "${STEP_LOG}" | tr -d "\r" | cut -c1-120)"
      next=$((next + HEARTBEAT))
    fi
  done
  wait "${STEP_PID}" || rc=$?
  STEP_PID=""
  if [ "${rc}" -eq 124 ]; then
    die "step ${name} exceeded ${STEP_TIMEOUT}s"
  fi
  [ "${rc}" -eq 0 ] || return "${rc}"
  say "step ${name} done in $((SECONDS - started))s"
}

# Temporary files live in the cache, on the same filesystem as the results they are moved to.
make_tmp() {
  mkdir -p "${CACHE}/tmp"
  TMP_DIR="$(mktemp -d "${CACHE}/tmp/build.XXXXXX")"
}

# debootstrap mounts /proc and /sys inside its target; a killed run can leave them mounted.
remove_tmp() {
  [ -n "${TMP_DIR}" ] && [ -d "${TMP_DIR}" ] || return 0
  awk -v dir="${TMP_DIR}/" 'index($2, dir) == 1 { print $2 }' /proc/self/mounts | sort -r |
    while read -r mountpoint; do umount -l "${mountpoint}" || true; done
  rm -rf --one-file-system "${TMP_DIR}"
  TMP_DIR=""
}

parse_args() {
  OUTPUT_DIR=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --output)
        [ $# -ge 2 ] || die "--output needs a directory"
        OUTPUT_DIR="$2"
        shift 2
        ;;
      -h | --help)
        sed -n '2,/^set -euo/p' "${SELF}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
        exit 0
        ;;
      *) die "unknown argument: $1 (usage: build.sh [--output DIR])" ;;
    esac
  done
}

install_packages() {
  STEP="install packages"
  bash "${ROOT}/.ci/install-debian-packages" >&2
}

# The Debian mirror apt already uses here (its deb822 .sources or one-line sources.list).
debian_mirror() {
  if [ -n "${DSTREAM_IMAGE_MIRROR:-}" ]; then
    echo "${DSTREAM_IMAGE_MIRROR}"
    return
  fi
  local url
  url="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
    2>/dev/null | grep -v '^[[:space:]]*#' | grep -oE 'https?://[^[:space:]]+/debian/?([[:space:]]|$)' |
    head -n 1 | tr -d '[:space:]' || true)"
  echo "${url:-http://deb.debian.org/debian}"
}

# overlay unless this kernel/filesystem refuses it; fixed once the storage exists.
storage_driver() {
  if [ -n "${DSTREAM_IMAGE_STORAGE_DRIVER:-}" ]; then
    echo "${DSTREAM_IMAGE_STORAGE_DRIVER}"
  elif [ -s "${STORAGE}/driver" ]; then
    cat "${STORAGE}/driver"
  else
    local probe
    probe="$(mktemp -d "${CACHE}/tmp/overlay-probe.XXXXXX")"
    mkdir "${probe}/lower" "${probe}/upper" "${probe}/work" "${probe}/merged"
    if mount -t overlay overlay -o "lowerdir=${probe}/lower,upperdir=${probe}/upper,workdir=${probe}/work" \
      "${probe}/merged" 2>/dev/null; then
      umount "${probe}/merged"
      echo overlay
    else
      echo vfs
    fi
    rm -rf "${probe}"
  fi
}

setup_buildah() {
  STEP="buildah storage"
  mkdir -p "${STORAGE}" "${CACHE}/tmp"
  local driver
  driver="$(storage_driver)"
  echo "${driver}" >"${STORAGE}/driver"
  BUILDAH=(buildah --root "${STORAGE}/root" --runroot "${STORAGE}/run" --storage-driver "${driver}")
  say "buildah storage ${STORAGE} (driver ${driver})"
}

# The name the Dockerfile's first FROM resolves to with default build args, fully qualified the way
# a Docker client would (debian:bookworm-slim -> docker.io/library/debian:bookworm-slim).
dockerfile_base() {
  local from name
  from="$(awk 'toupper($1) == "FROM" { print $2; exit }' "${ROOT}/Dockerfile")"
  if [[ "${from}" =~ ^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$ ]]; then
    name="${BASH_REMATCH[1]}"
    from="$(awk -v arg="${name}" 'toupper($1) == "ARG" && index($2, arg "=") == 1 {
      sub(/^[^=]*=/, "", $2); print $2; exit }' "${ROOT}/Dockerfile")"
    [ -n "${from}" ] || die "Dockerfile: FROM \${${name}} has no ARG ${name}=default"
  fi
  from="${from//\"/}"
  case "${from}" in
    */*/* | localhost/*) ;;
    */*) [[ "${from%%/*}" == *.* || "${from%%/*}" == *:* ]] || from="docker.io/${from}" ;;
    *) from="docker.io/library/${from}" ;;
  esac
  [[ "${from}" == *:* || "${from}" == *@* ]] || from="${from}:latest"
  echo "${from}"
}

# Files that make up the build context: all git-listed files except the top-level names that
# .dockerignore drops (the Dockerfile and .dockerignore themselves are hashed separately).
context_files() {
  local excludes=() name
  while read -r name; do
    case "${name}" in
      '' | '#'* | *'*'* | *'?'* | *'['* | '!'* | */*) continue ;;
    esac
    excludes+=(":(exclude)${name}")
  done <"${ROOT}/.dockerignore"
  git -C "${ROOT}" ls-files -z --cached --others --exclude-standard -- . "${excludes[@]}" |
    sort -z -u
}

# One path per line (names with newlines are not supported), only files present in the work tree.
existing_context_files() {
  context_files | while IFS= read -r -d '' file; do
    if [ -f "${ROOT}/${file}" ]; then printf '%s\n' "${file}"; fi
  done
}

image_key() {
  local base_key="$1" files
  files="$(existing_context_files)"
  (
    cd "${ROOT}"
    echo "base ${base_key}"
    git hash-object --no-filters Dockerfile .dockerignore pyproject.toml e2e/image/build.sh \
      e2e/image/tag.sh
    xargs -r -d '\n' stat -c '%n %a' <<<"${files}"
    git hash-object --no-filters --stdin-paths <<<"${files}"
  ) | sha256sum | cut -c1-16
}

# Settings of Debian's official slim images (debuerreotype): no docs/man/locales from later
# installs, apt cleans its package cache, services are never started at install time.
slim_rootfs() {
  local rootfs="$1" mirror="$2"
  cat >"${rootfs}/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
EOF
  cat >"${rootfs}/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"${rootfs}/etc/apt/apt.conf.d/docker-no-languages"
  echo 'Acquire::GzipIndexes "true";' >"${rootfs}/etc/apt/apt.conf.d/docker-gzip-indexes"
  printf '#!/bin/sh\nexit 101\n' >"${rootfs}/usr/sbin/policy-rc.d"
  chmod 0755 "${rootfs}/usr/sbin/policy-rc.d"
  rm -f "${rootfs}/etc/apt/sources.list"
  cat >"${rootfs}/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: ${mirror}
Suites: ${SUITE} ${SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/}-security
Suites: ${SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  chroot "${rootfs}" apt-get clean
  find "${rootfs}/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "${rootfs}/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "${rootfs}/usr/share/man/"* "${rootfs}/usr/share/info/"* "${rootfs}/usr/share/groff/"* \
    "${rootfs}/usr/share/lintian/"* "${rootfs}/var/lib/apt/lists/"* "${rootfs}/var/log/"*.log \
    "${rootfs}/var/cache/debconf/"*-old "${rootfs}/etc/hostname"
  find "${rootfs}/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  : >"${rootfs}/etc/machine-id"
  : >"${rootfs}/etc/resolv.conf"
}

ensure_base_tarball() {
  BASE_TAR="${CACHE}/base/${SUITE}-${VARIANT}.tar"
  if [ -s "${BASE_TAR}" ]; then
    say "base rootfs: cached ${BASE_TAR}"
    return
  fi
  local mirror rootfs
  mirror="$(debian_mirror)"
  make_tmp
  rootfs="${TMP_DIR}/rootfs"
  run_step debootstrap debootstrap --variant="${VARIANT}" "${SUITE}" "${rootfs}" "${mirror}"
  STEP="slim base rootfs"
  slim_rootfs "${rootfs}" "${mirror}"
  mkdir -p "${CACHE}/base"
  run_step base-tarball tar --numeric-owner --xattrs --xattrs-include='*' -C "${rootfs}" \
    --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' --exclude='./run/*' \
    -cf "${TMP_DIR}/base.tar" .
  mv "${TMP_DIR}/base.tar" "${BASE_TAR}"
  remove_tmp
  say "base rootfs: ${BASE_TAR} ($(du -h "${BASE_TAR}" | cut -f1))"
}

local_ca_files() {
  [ -n "${LOCAL_CA_DIR}" ] && [ -d "${LOCAL_CA_DIR}" ] || return 0
  find "${LOCAL_CA_DIR}" -maxdepth 1 -type f -name '*.crt' | sort
}

# The base image gets this host's local CAs in /usr/local/share/ca-certificates, where the
# Dockerfile's install of ca-certificates picks them up: pip inside the build then trusts what
# pip on this host trusts. Imported once per base tarball and CA set; a stamp remembers which.
ensure_base_image() {
  BASE_REF="$(dockerfile_base)"
  BASE_KEY="$( (sha256sum "${BASE_TAR}" | cut -d' ' -f1; local_ca_files | xargs -r -d '\n' cat) |
    sha256sum | cut -c1-16)"
  local stamp="${STORAGE}/base-${BASE_KEY}.imported" mountpoint
  if [ -e "${stamp}" ] && "${BUILDAH[@]}" inspect --type image "${BASE_REF}" >/dev/null 2>&1; then
    say "base image: ${BASE_REF} already in storage"
    return
  fi
  STEP="import base image ${BASE_REF}"
  say "step import: ${BASE_TAR} as ${BASE_REF}"
  WORK_CONTAINER="$("${BUILDAH[@]}" from scratch)"
  mountpoint="$("${BUILDAH[@]}" mount "${WORK_CONTAINER}")"
  tar --numeric-owner --xattrs --xattrs-include='*' -xpf "${BASE_TAR}" -C "${mountpoint}"
  local_ca_files | while read -r ca; do
    say "base image trusts local CA ${ca}"
    install -D -m 0644 "${ca}" "${mountpoint}/usr/local/share/ca-certificates/${ca##*/}"
  done
  "${BUILDAH[@]}" umount "${WORK_CONTAINER}" >/dev/null
  "${BUILDAH[@]}" config --os linux --arch amd64 \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd '["bash"]' \
    --label "dev.dstream.base=debootstrap ${SUITE} ${VARIANT}" "${WORK_CONTAINER}"
  "${BUILDAH[@]}" commit --quiet --rm --format docker "${WORK_CONTAINER}" "${BASE_REF}" >/dev/null
  WORK_CONTAINER=""
  rm -f "${STORAGE}"/base-*.imported
  touch "${stamp}"
}

build_layers() {
  run_step build "${BUILDAH[@]}" bud --isolation chroot --pull=never --layers --force-rm \
    --format docker --tag "localhost/${IMAGE_REF}" --file "${ROOT}/Dockerfile" "${ROOT}"
}

ensure_image_tarball() {
  local key
  STEP="hash build context"
  key="$(image_key "${BASE_KEY}")"
  IMAGE_TAR="${CACHE}/images/dstream-e2e-${key}.tar"
  if [ -s "${IMAGE_TAR}" ]; then
    say "image: cached ${IMAGE_TAR} (key ${key})"
    return
  fi
  say "image: building (key ${key})"
  make_tmp
  build_layers || {
    # A RUN step failed once with "Close_Fd sealing memfd copy: Device or resource busy"
    # (buildah's chroot isolation) and the same build passed at the next attempt. The cached
    # layers make the retry start at the failed step.
    grep -q "sealing memfd copy" "${STEP_LOG}" || return 1
    say "step build: buildah could not seal its memfd copy (transient); trying once more"
    build_layers
  }
  run_step archive "${BUILDAH[@]}" push --quiet "localhost/${IMAGE_REF}" \
    "docker-archive:${TMP_DIR}/image.tar:${IMAGE_REF}"
  mkdir -p "${CACHE}/images"
  find "${CACHE}/images" -maxdepth 1 -name 'dstream-e2e-*.tar' -delete
  mv "${TMP_DIR}/image.tar" "${IMAGE_TAR}"
  remove_tmp
  say "image: ${IMAGE_TAR} ($(du -h "${IMAGE_TAR}" | cut -f1))"
  prune_storage || say "warning: could not prune older images from ${STORAGE}"
}

# Each build with a new pyproject.toml leaves a ~650 MB pip layer behind. Keeps the images whose
# layers are a prefix of the new image's (its base and the build's cached steps), removes the rest
# (removing an image also removes its untagged parents that have no other child).
prune_storage() {
  STEP="prune older layers"
  local keep id layers
  keep="$(image_layers "localhost/${IMAGE_REF}")"
  "${BUILDAH[@]}" images --all --quiet --no-trunc | sort -u | while read -r id; do
    layers="$(image_layers "${id}" 2>/dev/null)" || continue # removed with a child already
    if [ -n "${layers}" ] && [[ "${keep}" == "${layers}"* ]]; then continue; fi
    "${BUILDAH[@]}" rmi --force "${id}" >/dev/null 2>&1 || true
  done
  say "buildah storage: $(du -sh "${STORAGE}" | cut -f1)"
}

image_layers() {
  "${BUILDAH[@]}" inspect --type image --format '{{range .OCIv1.RootFS.DiffIDs}}{{.}} {{end}}' "$1"
}

publish() {
  if [ -z "${OUTPUT_DIR}" ]; then
    echo "${IMAGE_TAR}"
    return
  fi
  STEP="copy to ${OUTPUT_DIR}"
  mkdir -p "${OUTPUT_DIR}"
  local target="${OUTPUT_DIR}/dstream-e2e.tar"
  rm -f "${target}"
  ln "${IMAGE_TAR}" "${target}" 2>/dev/null || cp "${IMAGE_TAR}" "${target}"
  echo "${target}"
}

main() {
  parse_args "$@"
  trap on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  [ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, buildah storage)"
  mkdir -p "${CACHE}" "${LOGS}"
  exec 9>"${CACHE}/lock"
  if ! flock -n 9; then
    say "waiting for another build holding ${CACHE}/lock"
    flock -w "${STEP_TIMEOUT}" 9 || die "gave up waiting for ${CACHE}/lock"
  fi
  local started="${SECONDS}"
  install_packages
  setup_buildah
  ensure_base_tarball
  ensure_base_image
  ensure_image_tarball
  publish
  STEP="done"
  say "done in $((SECONDS - started))s: ${IMAGE_REF} in ${IMAGE_TAR}"
}

main "$@"
