#!/usr/bin/env bash
# Installs what attnc needs on Debian 12 (bookworm), only what is missing, and says what
# it did. Safe to run again.
#   - apt: LLVM 22 (llvm-22-dev, libpolly-22-dev) + libzstd-dev, zlib1g-dev and g++
#     (libstdc++) for the static LLVM link, and python3-venv when `python3 -m venv` does
#     not work; needs root or sudo only when something is missing.
#   - .venv/ in the repository with the NVIDIA wheels that ship ptxas, nvdisasm and
#     cuobjdump (PyPI; no CUDA install, no GPU needed).
#   - with --python: maturin, pytest and torch in .venv (the Python package's build and tests).
# Assumes cargo (rustup), python3 and a C compiler are installed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

say() { echo "[setup] $*"; }
die() { echo "[setup] error: $*" >&2; exit 1; }

# g++ brings libstdc++-12-dev: the static LLVM link needs -lstdc++ (gcc alone lacks it).
APT_PKGS=(llvm-22-dev libpolly-22-dev libzstd-dev zlib1g-dev g++)
WHEELS=("nvidia-cuda-nvcc>=13,<14" "nvidia-cuda-nvdisasm>=13,<14" "nvidia-cuda-cuobjdump>=13,<14")

# ---- prerequisites we do not install ---------------------------------------------------
command -v cargo >/dev/null 2>&1 || [ -x "$HOME/.cargo/bin/cargo" ] \
    || die "cargo not found: install Rust with rustup (https://rustup.rs), then run this again"
command -v python3 >/dev/null 2>&1 || die "python3 not found: apt-get install python3"
command -v cc >/dev/null 2>&1 || die "no C compiler (cc) found: apt-get install gcc"
# rustfmt and clippy: the test command checks formatting and lints.
if [ -d "$HOME/.cargo/bin" ]; then export PATH="$HOME/.cargo/bin:$PATH"; fi
for comp in rustfmt clippy; do
    sub=$([ "$comp" = rustfmt ] && echo fmt || echo clippy)
    if ! cargo "$sub" --version >/dev/null 2>&1; then
        command -v rustup >/dev/null 2>&1 || die "cargo $sub is missing and rustup is not installed to add $comp"
        say "rustup: adding the $comp component"
        rustup component add "$comp" || die "rustup could not add $comp"
    fi
done

# ---- apt packages -------------------------------------------------------------------------
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

apt_install() { # apt_install PKG... : apt-get update + install, as root or through sudo
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || die "need to install $*: run as root or install sudo"
        sudo=(sudo)
    fi
    say "apt: installing $*"
    if [ -z "${APT_UPDATED:-}" ]; then
        "${sudo[@]}" apt-get update
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "$@" \
        || die "apt-get could not install $*. LLVM 22 comes from Debian 12's bookworm(-security) repositories: make sure /etc/apt/sources.list(.d) lists them (or add apt.llvm.org's llvm-toolchain-bookworm-22)"
    say "apt: installed $*"
}

missing=()
for p in "${APT_PKGS[@]}"; do
    installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    say "apt: nothing to install (${APT_PKGS[*]} present)"
else
    apt_install "${missing[@]}"
fi
[ -x /usr/lib/llvm-22/bin/llvm-config ] || die "/usr/lib/llvm-22/bin/llvm-config is missing after install"

# ---- the NVIDIA tools, in .venv ----------------------------------------------------------
venv_ok() { [ -x .venv/bin/python ] && .venv/bin/python -m pip --version >/dev/null 2>&1; }
if venv_ok; then
    say "venv: .venv exists"
else
    rm -rf .venv
    say "venv: creating .venv"
    if ! python3 -m venv .venv >/dev/null 2>&1; then
        # Debian's python3 needs python3-venv (ensurepip) to create venvs.
        rm -rf .venv
        installed python3-venv || apt_install python3-venv
        python3 -m venv .venv
    fi
    venv_ok || die "python3 -m venv .venv did not produce a working pip"
fi

tool_path() { # first match of .venv/lib/python*/site-packages/nvidia/*/bin/<tool>
    local f
    for f in .venv/lib/python3*/site-packages/nvidia/cu13/bin/"$1" \
             .venv/lib/python3*/site-packages/nvidia/*/bin/"$1"; do
        if [ -x "$f" ]; then echo "$ROOT/$f"; return 0; fi
    done
    return 1
}

need=()
tool_path ptxas >/dev/null || need+=("${WHEELS[0]}")
tool_path nvdisasm >/dev/null || need+=("${WHEELS[1]}")
tool_path cuobjdump >/dev/null || need+=("${WHEELS[2]}")
if [ ${#need[@]} -eq 0 ]; then
    say "venv: ptxas, nvdisasm and cuobjdump already installed"
else
    say "venv: pip install ${need[*]}"
    .venv/bin/python -m pip install --disable-pip-version-check --no-input -q "${need[@]}"
fi

PTXAS="$(tool_path ptxas)" || die "ptxas is not in .venv after pip install"
say "ptxas:     $PTXAS ($("$PTXAS" --version | grep -m1 release || true))"
say "nvdisasm:  $(tool_path nvdisasm || echo 'not found')"
say "cuobjdump: $(tool_path cuobjdump || echo 'not found')"
# ---- the Python package's build and test tools, in .venv (with --python) ------------------
# maturin builds the extension (python/), pytest runs its tests, and torch is what the
# package plugs into (its CPU tests trace the ops with fake tensors; no GPU needed).
if [ "${1:-}" = "--python" ]; then
    PY_PKGS=("maturin>=1.7,<2" "pytest" "torch==2.11.0")
    py_missing=()
    .venv/bin/python -c "import maturin" >/dev/null 2>&1 || [ -x .venv/bin/maturin ] || py_missing+=("${PY_PKGS[0]}")
    .venv/bin/python -c "import pytest" >/dev/null 2>&1 || py_missing+=("${PY_PKGS[1]}")
    .venv/bin/python -c "import torch" >/dev/null 2>&1 || py_missing+=("${PY_PKGS[2]}")
    if [ ${#py_missing[@]} -eq 0 ]; then
        say "venv: maturin, pytest and torch already installed"
    else
        say "venv: pip install ${py_missing[*]} (torch brings several GB of CUDA libraries)"
        .venv/bin/python -m pip install --disable-pip-version-check --no-input -q "${py_missing[@]}"
    fi
fi

say "done. Builds need: export LLVM_SYS_221_PREFIX=/usr/lib/llvm-22 (scripts/env.sh sets it)"
