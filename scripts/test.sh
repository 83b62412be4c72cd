#!/usr/bin/env bash
# Every check, in order: formatting, clippy (no features, python, cuda), cargo test, the Rust MPI
# communicator under mpirun, Miri on the core, the extension built into the venv, pytest. Runs
# them all, then prints a summary and exits non-zero if any failed (a step that cannot run here
# says "SKIPPED: why" and shows as skipped).
#
#   scripts/test.sh                     # everything
#   scripts/test.sh clippy pytest       # only the named steps (names below)
#
# DLPART_MIRI_TIMEOUT bounds the Miri step in seconds (default 900). The set-up installs heat
# and torch for the tests against them unless DLPART_WITH_HEAT=0 (see scripts/setup.sh).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DLPART_WITH_HEAT="${DLPART_WITH_HEAT:-1}"
# shellcheck source=scripts/setup.sh
source scripts/setup.sh || exit 1

all_steps=(fmt clippy clippy-python clippy-cuda cargo-test cargo-test-cuda mpi miri build-ext pytest)
steps=("${@:-${all_steps[@]}}")
for s in "${steps[@]}"; do
    [[ " ${all_steps[*]} " == *" $s "* ]] || { echo "unknown step '$s' (steps: ${all_steps[*]})" >&2; exit 2; }
done

logs="target/test-logs"
mkdir -p "$logs"
results=()
failed=0

# The `mpi` feature (`MpiComm` over the `mpi` crate) builds against the system's MPI through
# `mpicc` (and bindgen, through libclang); both, and `mpirun`, come with setup.sh's packages.
# Where MPI is missing, what needs it is skipped, saying why, as pytest skips its MPI tests.
mpi_missing() {
    local tool
    for tool in mpicc mpirun; do
        command -v "$tool" >/dev/null || { echo "$tool not found (apt-get install openmpi-bin libopenmpi-dev)"; return; }
    done
}
mpi_feature() { [[ -n $(mpi_missing) ]] || echo ",mpi"; }

step_fmt() { cargo fmt --all --check; }
# The kernel bench and example need `bench-internals`: lint them with it too, and with `half`
# (the f16/bf16 element types) and `mpi` (MpiComm, its test and example), in the same pass.
# The API docs build without a warning (missing docs, broken or private links), MpiComm's,
# the Python and CUDA layers' and the f16/bf16 types' included; and so do the docs of the
# private items (rustdoc checks their links only when it documents them).
step_clippy() {
    local mpi
    mpi=$(mpi_feature)
    [[ -n $mpi ]] || echo "clippy and doc without feature mpi: $(mpi_missing)"
    cargo clippy --all-targets -- -D warnings &&
        cargo clippy --all-targets --features "bench-internals,half$mpi" -- -D warnings &&
        RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet --features "python,cuda,half$mpi" &&
        RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet --document-private-items \
            --features "python,cuda,half$mpi"
}
step_clippy-python() { cargo clippy --all-targets --features python -- -D warnings; }
# kernel-host-tests adds the host build of the kernels (kernels/host/) and its tests.
step_clippy-cuda() {
    cargo clippy --all-targets --features cuda -- -D warnings &&
        cargo clippy --all-targets --features kernel-host-tests -- -D warnings
}
# The doc tests run with the unit tests; the Rust tour runs as a user would run it.
step_cargo-test() {
    cargo test && cargo run --quiet --example quickstart && cargo run --quiet --example spmd
}
# The CUDA backend's host-side tests, the kernel source itself run on the host over the
# backend's job tables (feature kernel-host-tests: kernels/*.cu compiled as C++ through
# kernels/host/shim.h, compared with the CPU backend), the backend's own path over the host
# emulation of the driver (tests/cuda_backend.rs: each test body on the CPU and the emulated
# CUDA backend, and on a GPU when there is one), and every kernel compiled to PTX by
# NVRTC (no GPU needed); DLPART_REQUIRE_NVRTC turns a missing libnvrtc into a failure rather
# than a skip.
# The kernels compile with both NVRTC majors a GPU machine may carry: 12 (the default loader
# path set by setup.sh) and 13 (the lent GPU machines' CUDA), found by its own soname.
# The library's tests build here with features anyway, so `half` rides along: its f16/bf16
# element tests run in this build rather than in a full test build of their own.
step_cargo-test-cuda() {
    DLPART_REQUIRE_NVRTC=1 cargo test --features kernel-host-tests,half --lib --test cuda_ptx --test cuda_backend &&
        DLPART_REQUIRE_NVRTC=1 DLPART_NVRTC_MAJOR=13 LD_LIBRARY_PATH="$_dlpart_site/nvidia/cu13/lib" \
            cargo test --features cuda --test cuda_ptx
}
# MpiComm across processes: tests/mpi.rs (its own main: random layouts checked against ndarray
# on every rank, `ok <rank>: <n> checks` from each) and the example, run by mpirun on 4 ranks
# however many cores there are (oversubscribed), each bounded by a timeout; the test runs again
# with every message cut at 7 bytes, as one beyond MPI's C-int counts is cut at 1 GiB. A failed
# check aborts every rank. Then MpiComm's doc example is compiled (it needs mpirun to run).
mpi_runner=(--config "target.'cfg(all())'.runner = ['timeout', '120', 'mpirun', '--oversubscribe', '-n', '4']")
step_mpi() {
    local missing
    missing=$(mpi_missing)
    if [[ -n $missing ]]; then echo "SKIPPED: $missing"; return 0; fi
    cargo test --features mpi --test mpi "${mpi_runner[@]}" &&
        DLPART_MPI_MESSAGE_BYTES=7 cargo test --features mpi --test mpi "${mpi_runner[@]}" -- 60 &&
        cargo run --quiet --features mpi --example mpi_spmd "${mpi_runner[@]}" &&
        cargo test --features mpi --doc MpiComm
}
# Miri runs the modules with unsafe code. The grid and planner hold none, and their
# 65,536-partition tests would take Miri hours; one kernel test loops over thousands of random
# layouts and runs natively only (its small siblings cover the same code under Miri), as do
# the SPMD tests of random layouts on several threads and the rounds' index arithmetic (no
# unsafe code; 69 s of Miri's time), as does the property test of the claims' conflict rule
# (pure index arithmetic: 177 s of Miri's time for its 20 cases). Miri interprets on one
# thread, so its tests run as two shards of about equal time side by side, each logged whole
# when it ends.
miri_skip=(
    --skip backend::cpu::tests::index::gather_and_scatter_match_naive_loops
    --skip spmd::tests::random_repartitions_across_ranks_equal_the_reference
    --skip spmd::tests::random_gathers_and_scatters_across_ranks_equal_the_reference
    --skip spmd::tests::rounds::random_repartitions_in_many_rounds_equal_the_reference
    --skip spmd::exchange::rounds::tests::
    --skip access::tests::claims_conflict_exactly_when_they_share_a_byte
)
miri_shard_a=(backend::cpu::tests::copy:: backend::cpu::tests::index:: backend::cpu::tests::backend::
    backend::cpu::tests::slabs:: backend::cpu::tests::direct:: backend::cpu::tests::repart::
    backend::cpu::normalise:: tensor:: spmd::tests_)
miri_shard() { # $1 = log file; the rest: test filters
    local log=$1
    shift
    timeout "${DLPART_MIRI_TIMEOUT:-900}" cargo +nightly miri test --lib -- "$@" "${miri_skip[@]}" >"$log" 2>&1
}
step_miri() {
    { rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal; } &&
        rustup component add miri rust-src --toolchain nightly &&
        cargo +nightly miri setup &&
        cargo +nightly miri test --lib --no-run || return
    local a=$logs/miri-shard-a.log b=$logs/miri-shard-b.log
    miri_shard "$a" "${miri_shard_a[@]}" &
    local pa=$!
    miri_shard "$b" access:: dlpack:: tensor:: ops:: backend:: error:: device:: dtype:: spmd:: \
        "${miri_shard_a[@]/#/--skip=}" &
    local pb=$!
    local ra=0 rb=0
    wait "$pa" || ra=$?
    wait "$pb" || rb=$?
    cat "$a" "$b"
    ((ra == 0 && rb == 0))
}
step_build-ext() { dlpart_build_extension; }
step_pytest() {
    python -m pytest tests/python -q -rs -p no:cacheprovider
    local rc=$?
    # 5 means nothing was collected: a broken test tree must not look like success.
    if ((rc == 5)); then echo "pytest collected no tests" >&2; fi
    return "$rc"
}

for s in "${steps[@]}"; do
    printf '\n==== %s ====\n' "$s"
    start=$SECONDS
    "step_$s" 2>&1 | tee "$logs/$s.log"
    rc=${PIPESTATUS[0]}
    secs=$((SECONDS - start))
    if ((rc == 0)); then status=ok; else status="FAILED (exit $rc)"; failed=1; fi
    if ((rc == 0)) && grep -q '^SKIPPED: ' "$logs/$s.log"; then status=skipped; fi
    results+=("$(printf '%-14s %-18s %4ss' "$s" "$status" "$secs")")
done

# Counts come from the tools' own closing lines: cargo's `test result:` and pytest's summary.
count() { # $1 = log file, $2 = regex for the word; sums "<n> <word>" on the closing lines
    [[ -f "$1" ]] || { echo 0; return; }
    grep -E '^test result:|[0-9]+ (passed|failed|skipped|errors?)\b.* in [0-9.]+s' "$1" |
        grep -oE "[0-9]+ ($2)\b" | awk '{n += $1} END {print n + 0}'
}
total_p=0 total_f=0 total_s=0
printf '\n==== summary ====\n'
for r in "${results[@]}"; do echo "$r"; done
echo
for s in cargo-test cargo-test-cuda miri pytest; do
    [[ " ${steps[*]} " == *" $s "* ]] || continue
    log="$logs/$s.log"
    p=$(count "$log" passed)
    f=$(count "$log" 'failed|errors?')
    k=$(count "$log" 'ignored|skipped')
    printf '%-10s %d passed, %d failed, %d skipped\n' "$s:" "$p" "$f" "$k"
    total_p=$((total_p + p)) total_f=$((total_f + f)) total_s=$((total_s + k))
done
echo "$total_p passed, $total_f failed, $total_s skipped"
if ((failed)); then echo "FAILED" >&2; exit 1; fi
