#!/usr/bin/env bash
# Prepare this checkout on a fresh Debian 12 machine: system packages, the Python venv with pinned
# packages, and the environment the tests and benchmarks need. Idempotent and quick on reruns.
#
#   source scripts/setup.sh    # set up, then keep the environment in this shell
#   bash scripts/setup.sh      # set up only
#
# DLPART_VENV overrides the venv location (default: <repo>/.venv).

_dlpart_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_dlpart_venv="${DLPART_VENV:-$_dlpart_root/.venv}"

# Versions verified together on CPython 3.11 (Debian 12). Changing this list changes the stamp,
# so the next run reinstalls. xgboost_ray runs only with xgboost <= 2.0.3 (its own pin is
# missing), and imports ray.train, which needs pydantic.
_dlpart_requirements='
numpy==2.4.6
jax[cpu]==0.10.2
jaxlib==0.10.2
array-api-strict==2.6.1
pyarrow==26.0.1
dpctl==0.21.1
intel-opencl-rt==2025.3.3
mpi4py==4.1.2
dask==2026.8.0
distributed==2026.8.0
ray==2.60.0
nvidia-cuda-nvrtc-cu12==12.9.86
nvidia-cuda-nvrtc==13.5.37
hypothesis==6.170.15
pytest==9.2.0
pytest-timeout==2.4.0
maturin==1.16.0
matplotlib==3.11.2
cloudpickle==3.1.2
mypy==1.18.2
pyright==1.1.408
xgboost==2.0.3
xgboost_ray==0.1.19
pandas==3.1.1
wrapt==2.5.2
pydantic==2.14.3
'
# heat (the MPI consumer of __partitioned__) needs torch, whose PyPI wheels bring several GB of
# CUDA libraries (70 s to install on the development machine): installed with DLPART_WITH_HEAT=1,
# which the test command sets unless it is 0. Without them the tests against real heat and torch
# skip, and a test of heat's exact dict form runs instead. A failed install of these two is
# reported and the set-up goes on: their tests then skip, saying why.
_dlpart_heat_requirements='
heat==1.8.0
torch==2.11.0
'
# libclang-dev: the `mpi` cargo feature's bindings (rsmpi's mpi-sys) run bindgen over mpi.h.
_dlpart_apt_packages=(openmpi-bin libopenmpi-dev build-essential libclang-dev)

_dlpart_log() { printf '[setup] %s\n' "$*" >&2; }

# The installing part runs in a subshell so `set -e` never leaks into a shell that sourced us.
(
    set -euo pipefail
    cd "$_dlpart_root"

    missing=()
    for pkg in "${_dlpart_apt_packages[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    if ((${#missing[@]})); then
        sudo=()
        if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
        _dlpart_log "apt-get install ${missing[*]}"
        "${sudo[@]}" apt-get update -qq
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi

    command -v cargo >/dev/null || { _dlpart_log "cargo not found: install Rust with rustup first"; exit 1; }
    for component in rustfmt clippy; do
        if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
            rustup component add "$component"
        fi
    done

    if [[ ! -x "$_dlpart_venv/bin/python" ]]; then
        _dlpart_log "creating venv $_dlpart_venv"
        python3 -m venv "$_dlpart_venv"
    fi
    stamp="$_dlpart_venv/.dlpart-requirements.sha256"
    want="$( { "$_dlpart_venv/bin/python" -VV; printf '%s' "$_dlpart_requirements"; } | sha256sum | cut -d' ' -f1)"
    if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
        _dlpart_log "pip install (pinned requirements changed or first run)"
        # shellcheck disable=SC2086  # one requirement per word
        "$_dlpart_venv/bin/python" -m pip install --quiet --no-compile $_dlpart_requirements
        echo "$want" >"$stamp"
    fi
    if [[ "${DLPART_WITH_HEAT:-0}" == 1 ]] && ! "$_dlpart_venv/bin/python" -c 'import heat' 2>/dev/null; then
        _dlpart_log "pip install heat and torch (DLPART_WITH_HEAT=1)"
        # shellcheck disable=SC2086  # one requirement per word
        "$_dlpart_venv/bin/python" -m pip install --quiet --no-compile $_dlpart_heat_requirements ||
            _dlpart_log "heat and torch could not be installed: their tests will skip"
    fi
) || {
    _dlpart_log "set-up failed"
    # `return` when sourced, `exit` when run.
    return 1 2>/dev/null || exit 1
}

export VIRTUAL_ENV="$_dlpart_venv"
case ":$PATH:" in *":$VIRTUAL_ENV/bin:"*) ;; *) export PATH="$VIRTUAL_ENV/bin:$PATH" ;; esac
# pyo3's build script keys its cache on the interpreter; pin it so PATH changes do not rebuild.
export PYO3_PYTHON="$VIRTUAL_ENV/bin/python"

_dlpart_site="$("$VIRTUAL_ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
_dlpart_nvrtc="$_dlpart_site/nvidia/cuda_nvrtc/lib"
case ":${LD_LIBRARY_PATH:-}:" in
    *":$_dlpart_nvrtc:"*) ;;
    *) export LD_LIBRARY_PATH="$_dlpart_nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
esac

# Four host devices for jax's sharding tests.
export XLA_FLAGS="--xla_force_host_platform_device_count=4"
# The Intel OpenCL CPU runtime from intel-opencl-rt: dpctl's SYCL device on a machine without a GPU.
export OCL_ICD_FILENAMES="$VIRTUAL_ENV/lib/libintelocl.so"
# Keeps hwloc (inside Open MPI) from loading its OpenCL plugin, which would open the Intel OpenCL
# runtime in every MPI process as well.
export HWLOC_PLUGINS_BLACKLIST="hwloc_opencl.so"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export RAY_AUTH_MODE=disabled
# The packages are installed without byte-compiling them (--no-compile), and some environments
# set PYTHONDONTWRITEBYTECODE: every Python process the tests start (mpirun's ranks, the
# benchmark, ray's and dask's workers) would then compile numpy, jax, torch and heat from source
# again, seconds each. Python writes each module's cache on its first import instead, under
# target/ rather than beside the sources.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$_dlpart_root/target/pycache"

# Build the extension into the venv: maturin develop installs the package editable and puts
# _core.abi3.so next to python/dlpart. Debug by default (tests); pass --release for benchmarks.
dlpart_build_extension() {
    (cd "$_dlpart_root" && maturin develop --quiet "$@")
}
