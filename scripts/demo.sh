#!/usr/bin/env bash
# The main job: set up what is missing, build the release `attnc`, show the PTX it
# generates for the causal example, check every example with ptxas for sm_80, sm_90a and
# sm_100a, and, on a machine with an NVIDIA GPU, run the GPU self-test. Ends with a
# summary of what ran, what was skipped and why; exits non-zero when a step failed or a
# GPU was present but no GPU code ran.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

EXAMPLE=dsl-examples/causal.attn
SUMMARY=()
CURRENT=""
step() { CURRENT="$*"; echo; echo "==== $*"; }
note() { SUMMARY+=("$*"); }
finish() {
    local rc=$?
    echo
    echo "==== summary"
    for line in "${SUMMARY[@]}"; do echo "  $line"; done
    if [ "$rc" -ne 0 ]; then
        echo "  FAILED       at: $CURRENT (exit $rc)"
        echo "demo: FAILED"
    else
        echo "demo: ok"
    fi
}
trap finish EXIT

step "setup (scripts/setup.sh)"
bash scripts/setup.sh
source scripts/env.sh
note "setup        LLVM 22 + ptxas ready (ptxas: ${ATTNC_PTXAS:-not found})"

step "build: cargo build --release -p attnc-cli"
cargo build --release -p attnc-cli
BIN="$ROOT/target/release/attnc"
note "build        $BIN ($(du -h "$BIN" | cut -f1))"

step "attnc dump $EXAMPLE --arch sm_90a --emit ptx | head -n 40"
"$BIN" dump "$EXAMPLE" --arch sm_90a --emit ptx | head -n 40
note "dump         PTX for $EXAMPLE on sm_90a"

step "attnc dump $EXAMPLE --arch sm_90a --emit ir"
"$BIN" dump "$EXAMPLE" --arch sm_90a --emit ir
note "dump         IR + compile summary for $EXAMPLE"

step "attnc check $EXAMPLE --arch all"
"$BIN" check "$EXAMPLE" --arch all
note "check        $EXAMPLE assembled by ptxas for sm_80, sm_90a, sm_100a: no spills, within budgets"

step "attnc check dsl-examples/*.attn --arch all"
"$BIN" check dsl-examples/*.attn --arch all
note "check        all $(ls dsl-examples/*.attn | wc -l) examples x 3 archs: no spills, within budgets"

step "GPU"
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "nvidia-smi not found: no NVIDIA GPU/driver here, so no GPU code runs on this machine."
    note "GPU          SKIPPED: no NVIDIA driver/GPU on this machine (nvidia-smi not found)"
elif ! nvidia-smi -L; then
    echo "nvidia-smi lists no GPU: no GPU code runs on this machine."
    note "GPU          SKIPPED: nvidia-smi lists no GPU"
elif "$BIN" selftest --help >/dev/null 2>&1; then
    gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
    echo "running: attnc selftest --quick on $gpu"
    "$BIN" selftest --quick
    note "GPU          attnc selftest --quick PASSED on $gpu (the full matrix: attnc selftest)"
else
    echo "This machine has a GPU, but this build of attnc has no 'selftest' subcommand"
    echo "(the CUDA runtime is not in yet): NO GPU CODE RAN."
    note "GPU          NOT RUN: a GPU is present but 'attnc selftest' does not exist in this build"
    exit 1
fi
