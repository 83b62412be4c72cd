#!/usr/bin/env bash
# dlpart's CUDA checks on a lent GPU machine (CUDA driver, torch, cupy, jax, Python 3.12, no
# network). Run from the repository root.
#
# Inputs:
#   $1     carry folder made here by benches/gpu/build_carry.sh (default .carry):
#            dlpart-*.whl  wheel built with features python + cuda
#            bin/cuda_*    Rust test binaries (tests/cuda_backend.rs, tests/cuda_ptx.rs)
#            wheels/       optional pytest wheels, used only when pytest is missing
#   $OUT   folder for results (default ./gpu-out)
#
# Outputs under $OUT (at most 8 files, the device tool's limit):
#   env.txt              GPU, driver, python, the libnvrtc used
#   rust-<binary>.log    each carried test binary, run with DLPART_REQUIRE_CUDA=1 (a missing
#                        driver or GPU fails instead of skipping)
#   pytest.log           pytest tests/python -m cuda
#   bench.log            python -m dlpart bench --device kDLCUDA:0 (its table), with
#   bench.json, .png     its results and chart
#
# DLPART_GPU_STEPS picks steps (default "rust pytest bench"), so that one device call can stay
# within its time limit; DLPART_BENCH_ARGS adds bench options (e.g. "--only rows_to_cols").
#   summary.txt          one line per step with its exit status
# Exits non-zero when any step failed.
set -uo pipefail
carry=$(realpath "${1:-.carry}")
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
work=$(mktemp -d)
summary="$OUT/summary.txt"
: >"$summary"
failed=0
step() { # step NAME STATUS
    echo "$1: exit $2" | tee -a "$summary"
    [ "$2" -eq 0 ] || failed=1
}

# libnvrtc: from the CUDA wheels torch/cupy pull in, or a toolkit. cudarc (built for CUDA 13)
# opens libnvrtc.so, libnvrtc.so.13 or libnvrtc.so.12; the link below also covers a machine
# whose only libnvrtc has another name.
sites=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
nvrtc=$(find $sites /usr/local /usr/lib /opt -maxdepth 6 \
    \( -name 'libnvrtc.so.12' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so' \) 2>/dev/null \
    | sort | head -n 1)
if [ -n "$nvrtc" ]; then
    mkdir -p "$work/nvrtc"
    ln -sf "$nvrtc" "$work/nvrtc/libnvrtc.so"
    export LD_LIBRARY_PATH="$work/nvrtc:$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export DLPART_REQUIRE_CUDA=1
steps=${DLPART_GPU_STEPS:-rust pytest bench}

{
    nvidia-smi || true
    python3 --version
    echo "libnvrtc: ${nvrtc:-NOT FOUND}"
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    ls -la "$carry" "$carry/bin"
} >"$OUT/env.txt" 2>&1

for bin in "$carry"/bin/cuda_*; do
    [[ " $steps " == *" rust "* ]] || break
    [ -x "$bin" ] || continue
    name=$(basename "$bin")
    "$bin" --test-threads=1 --nocapture >"$OUT/rust-$name.log" 2>&1
    step "rust $name" $?
done

# The wheel goes into a private folder on PYTHONPATH; numpy, torch and cupy come from the
# machine's own site-packages.
site="$work/site"
python3 -m pip install --quiet --no-index --no-deps --target "$site" "$carry"/dlpart-*.whl \
    >>"$OUT/env.txt" 2>&1
step "install wheel" $?
if ! python3 -c 'import pytest' 2>/dev/null && [ -d "$carry/wheels" ]; then
    python3 -m pip install --quiet --no-index --find-links "$carry/wheels" --target "$site" pytest \
        >>"$OUT/env.txt" 2>&1
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

if [[ " $steps " == *" pytest "* ]]; then
    python3 -m pytest tests/python -m cuda -q -rs -p no:cacheprovider >"$OUT/pytest.log" 2>&1
    rc=$?
    [ "$rc" -eq 5 ] && echo "no tests marked cuda were collected" >>"$OUT/pytest.log"
    step "pytest -m cuda" "$rc"
fi

# The GPU benchmark: the workloads of `python -m dlpart bench` on the GPU, with the GPU targets
# (rows->cols 8192² and 1 GiB float32 against cudaMemcpy D2D, torch cat+split+contiguous and the
# datasheet bandwidth; gather of blocks of 32 against the copy). bench.json carries the device,
# driver, commit, date and command; benches/results/ keeps a copy of each run measured.
if [[ " $steps " == *" bench "* ]]; then
    python3 -m dlpart bench --device kDLCUDA:0 --out "$OUT" ${DLPART_BENCH_ARGS:-} \
        >"$OUT/bench.log" 2>&1
    step "bench" $?
    rm -f "$OUT/bench.txt" # the table is in bench.log too; keeps $OUT within 8 files
fi

rm -rf "$work"
exit "$failed"
