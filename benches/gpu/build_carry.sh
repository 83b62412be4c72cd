#!/usr/bin/env bash
# Builds, on this (CPU-only) machine, what benches/gpu/run.sh needs on a lent GPU machine.
#
# Usage: benches/gpu/build_carry.sh [CARRY_DIR]      (default: .carry, relative to the repo)
#
# Writes into CARRY_DIR:
#   dlpart-*-abi3-*.whl   the wheel with features python + cuda (maturin, release)
#   bin/cuda_*            the CUDA Rust test binaries (cargo test --release --features cuda)
#   wheels/               pytest and its dependencies, for machines without pytest (optional:
#                         skipped when no package index can be reached)
# CARRY_DIR must be ignored by git (e.g. `/.carry` in .gitignore) and named in the device
# tool's `carry` list; the whole working tree plus carry must stay under 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=${1:-.carry}
py=${PYTHON:-python3}
rm -rf "$carry"
mkdir -p "$carry/bin"

# Release test binaries: a third of the debug size, and the 8192^2 test runs at speed.
cargo test --release --features cuda --no-run --message-format=json 2>/dev/null \
    | grep '"reason":"compiler-artifact"' | grep '"test":true' \
    | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 \
    | while read -r exe; do
        name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
        case "$name" in cuda_*) cp "$exe" "$carry/bin/$name" && strip "$carry/bin/$name" ;; esac
    done

# --features replaces pyproject.toml's list, so python is named again.
"${MATURIN:-maturin}" build --release --features python,cuda --out "$carry"

"$py" -m pip download --quiet --only-binary=:all: --python-version 3.12 \
    --dest "$carry/wheels" pytest 2>/dev/null || echo "no pytest wheels (offline): run.sh will need pytest on the GPU machine"

ls -la "$carry" "$carry/bin"
du -sh "$carry"
