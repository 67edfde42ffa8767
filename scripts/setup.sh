#!/usr/bin/env bash
# Idempotent set-up: .venv with the package (editable) and a Vulkan adapter for wgpu.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv" >&2
    python3 -m venv .venv
fi

# Reinstall only when the project's requirements changed.
stamp=.venv/.pipeline-installed
if [ ! -f "$stamp" ] || ! cmp -s pyproject.toml "$stamp"; then
    echo "setup: installing the package and its dependencies into .venv" >&2
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[dev]'
    cp pyproject.toml "$stamp"
fi

adapter_ok() {
    .venv/bin/python -c 'import pipeline.runtime as r; print("setup: wgpu adapter:", r.device_info()["adapter"])' 2>/dev/null
}
if ! adapter_ok; then
    echo "setup: wgpu finds no adapter; installing Mesa lavapipe (mesa-vulkan-drivers)" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q mesa-vulkan-drivers >/dev/null
    adapter_ok || { echo "setup: still no wgpu adapter after installing lavapipe" >&2; exit 1; }
fi

# The native WebGPUBackend for ExecuTorch's C++ runtime (pipeline.native), built against the
# installed wheels; rebuilt only when its sources or the WGSL files change. Everything else
# works without it, so a machine without a compiler gets one line and carries on.
if ! native=$(.venv/bin/python -m pipeline.native.build 2>&1); then
    echo "setup: native WebGPUBackend not built: $(echo "$native" | head -n 1 | sed "s/^native backend: //"); the rest works without it" >&2
else
    echo "setup: ${native}" >&2
fi
