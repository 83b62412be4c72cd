#!/usr/bin/env bash
# Set up (as scripts/setup.sh), build the extension in release mode, then run the benchmark CLI.
# Arguments go to `python -m dlpart bench`; see `scripts/bench.sh --help`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/setup.sh
source scripts/setup.sh
dlpart_build_extension --release
exec python -m dlpart bench "$@"
