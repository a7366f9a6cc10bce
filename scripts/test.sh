#!/usr/bin/env bash
# Sets up what is missing (scripts/setup.sh), then checks formatting (rustfmt), lints
# (clippy, warnings are errors) and the module layering (scripts/layers.py), and runs
# every test of the workspace with ptxas available: unit and property tests, the
# DSL -> PTX -> ptxas examples test (tests/examples.rs), the CLI tests, and the Python
# package's CPU tests (python/tests, built with maturin into .venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/setup.sh --python
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
# The Python extension links only as Python loads it: it is built by maturin below and
# tested by its Python tests.
cargo test --workspace --exclude attnc-python "$@"
echo "[test] the Python package: maturin develop, then pytest python/tests (CPU)"
VIRTUAL_ENV="$ROOT/.venv" .venv/bin/maturin develop --quiet -m python/Cargo.toml
.venv/bin/python -m pytest -q -p no:cacheprovider python/tests
echo "[test] all tests passed in $(( $(date +%s) - start ))s"
