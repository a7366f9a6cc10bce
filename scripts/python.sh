#!/usr/bin/env bash
# Builds the Python package `attnc` (python/, a Rust extension through maturin) and installs
# it into a Python environment: the active virtualenv, or $PYTHON, or else the repository's
# .venv. Sets up what is missing first (scripts/setup.sh: LLVM; maturin). PyTorch is not
# installed here: bring your own (any CUDA build >= 2.5).
#   bash scripts/python.sh            # release build
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
source scripts/env.sh
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -n "${VIRTUAL_ENV:-}" ]; then PY="$VIRTUAL_ENV/bin/python"
else PY="$ROOT/.venv/bin/python"; fi
echo "[python] installing into $("$PY" -c 'import sys; print(sys.prefix)')"
"$PY" -m maturin --version >/dev/null 2>&1 || "$PY" -m pip install --disable-pip-version-check -q "maturin>=1.7,<2"
rm -rf python/dist
"$PY" -m maturin build --release -m python/Cargo.toml -o python/dist --auditwheel skip
"$PY" -m pip install --disable-pip-version-check -q --force-reinstall --no-deps python/dist/attnc-*.whl
"$PY" -c "import attnc; print('[python] attnc', attnc.__version__, 'installed:', attnc.__file__)"
