# Sourced by the other scripts: the environment attnc's builds and tests need.
# Usage: source scripts/env.sh   (after scripts/setup.sh)
_attnc_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export LLVM_SYS_221_PREFIX="${LLVM_SYS_221_PREFIX:-/usr/lib/llvm-22}"
if [ -d "$HOME/.cargo/bin" ]; then
    case ":$PATH:" in *":$HOME/.cargo/bin:"*) ;; *) export PATH="$HOME/.cargo/bin:$PATH" ;; esac
fi
for _t in ptxas nvdisasm cuobjdump; do
    _var="ATTNC_$(echo "$_t" | tr '[:lower:]' '[:upper:]')"
    if [ -z "${!_var:-}" ]; then
        for _f in "$_attnc_root"/.venv/lib/python3*/site-packages/nvidia/cu13/bin/"$_t" \
                  "$_attnc_root"/.venv/lib/python3*/site-packages/nvidia/*/bin/"$_t"; do
            if [ -x "$_f" ]; then export "$_var=$_f"; break; fi
        done
    fi
done
unset _attnc_root _t _var _f
