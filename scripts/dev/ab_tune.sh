#!/usr/bin/env bash
# A/B of configuration overrides on the GPU, one binary, one command: runs
# `attnc bench --suites SUITE` once per LABEL in turn (reversed in even rounds), ROUNDS times
# (default 2), each with its environment, and writes OUT/<suite>_<label>_<round>.json (+ .txt).
#
# Usage: scripts/dev/ab_tune.sh SUITE OUT 'def=' 'own=ATTNC_HOPPER_BWD_TUNE=dq_own_reduce=1' ...
#   SUITE   prefill or backward (any `attnc bench --suites` value)
#   LABEL=ENV  ENV is empty or VAR=VALUE (one variable), e.g. ATTNC_HOPPER_TUNE=split_mask=1
# Then: python3 scripts/dev/ab_compare.py OUT SUITE BASE_LABEL
set -uo pipefail
SUITE=$1; OUT=$2; shift 2
ROUNDS=${ROUNDS:-2}
ATTNC=${ATTNC:-attnc}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null; date -u; } > "$OUT/device.txt"
# Even rounds run the labels in reverse: at 16k the second of a pair has read 2-4% low with
# identical kernels (docs/results/2026-11-27-h100-fwd-pv-wait/5-persistent/).
for round in $(seq 1 "$ROUNDS"); do
  order=("$@")
  if [ $((round % 2)) -eq 0 ]; then
    order=(); for ((i = $#; i >= 1; i--)); do order+=("${!i}"); done
  fi
  for pair in "${order[@]}"; do
    label=${pair%%=*}; envset=${pair#*=}
    if [ -n "$envset" ]; then
      env "$envset" "$ATTNC" bench --suites "$SUITE" --json "$OUT/${SUITE}_${label}_${round}.json" > "$OUT/${SUITE}_${label}_${round}.txt" 2>&1
    else
      "$ATTNC" bench --suites "$SUITE" --json "$OUT/${SUITE}_${label}_${round}.json" > "$OUT/${SUITE}_${label}_${round}.txt" 2>&1
    fi
    echo "$label round $round rc $? $(date -u)" >> "$OUT/device.txt"
  done
done
