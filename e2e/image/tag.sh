#!/usr/bin/env bash
# Prints the name the project's image is built as: dstream:<the project's version in
# pyproject.toml>. The chart's appVersion is that version, and a job that names no image runs
# the operator's, so the operator and its drivers are one version; build.sh, offline.sh and
# kind.sh tag the image so (tests/project/test_version.py checks that every place agrees).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python3 - "${ROOT}/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as file:
    print("dstream:" + tomllib.load(file)["project"]["version"])
PY
