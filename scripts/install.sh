#!/usr/bin/env bash
# Installs what the playground and its tests need: Debian packages (system OpenBLAS, which makes
# MLX's CPU matmuls 8-13x faster; Chromium for the browser tests), a venv in .venv, Python deps.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "$(uname)" == Linux ]] && command -v apt-get >/dev/null; then
  need=()
  for pkg in libopenblas0-pthread chromium; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
  if ((${#need[@]})); then
    sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check uv
.venv/bin/python -m uv pip install -q --python .venv/bin/python -r requirements.txt -r requirements-dev.txt
