#!/usr/bin/env bash
# Sets up what is missing (scripts/setup.sh), then checks formatting (rustfmt), lints
# (clippy, warnings are errors) and the module layering (scripts/layers.py), and runs
# every test of the workspace with ptxas available: unit and property tests, the
# DSL -> PTX -> ptxas examples test (tests/examples.rs) and the CLI tests.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/setup.sh
source scripts/env.sh
echo "[test] LLVM_SYS_221_PREFIX=$LLVM_SYS_221_PREFIX"
echo "[test] ATTNC_PTXAS=${ATTNC_PTXAS:-<not found>}"
echo "[test] cargo $(cargo --version | cut -d' ' -f2), rustc $(rustc --version | cut -d' ' -f2)"

start=$(date +%s)
echo "[test] cargo fmt --all --check"
cargo fmt --all --check
python3 scripts/layers.py
echo "[test] cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace "$@"
echo "[test] all tests passed in $(( $(date +%s) - start ))s"
