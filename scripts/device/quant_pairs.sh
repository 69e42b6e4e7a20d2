#!/usr/bin/env bash
# On the GPU machine: two builds compared in interleaved pairs (docs/perf.md's method):
# the quantized GEMVs alone at Qwen3-8B's shapes, then the quantized decode step of
# Qwen3-8B (context 512) and Qwen3-0.6B, bf16 timed first in each process.
#
# Stage xz-compressed release binaries in .device/pairs first: qb_old, qb_new
# (examples/quant_bandwidth of each build) and tf_old, tf_new (the tilefuse CLI of each),
# then `run` this with carry [".device/pairs"] (the four together stay under the carry
# limit at -6 compression only just; leave out a pair and its part is skipped). ROUNDS
# sets the pairs (default 2); a round of the two decode presets takes about 3.5 minutes
# of the device's time (the random 8B weights are drawn twice a process).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$(pwd)/.device/pairs
(cd "$B" && for f in *.xz; do xz -d -f "$f"; done; chmod +x "$B"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for round in $(seq "${ROUNDS:-2}"); do
  for b in old new; do
    if [[ -x "$B/qb_$b" ]]; then
      echo "== quant_bandwidth $b round $round"
      "$B/qb_$b" --8b 2>&1 | grep -E "^\| Q|copy ceiling"
    fi
  done
done 2>&1 | tee "$OUT/gemvs.log"
for round in $(seq "${ROUNDS:-2}"); do
  for b in old new; do
    [[ -x "$B/tf_$b" ]] || continue
    echo "== $b qwen3-8b round $round"
    "$B/tf_$b" bench --preset qwen3-8b --weights q4_k_m --no-eager --context 512 --tokens 64 \
      2>&1 | grep -E "median step|floor .* vs"
    echo "== $b qwen3-0.6b round $round"
    "$B/tf_$b" bench --preset qwen3-0.6b --weights q4_k_m --no-eager 2>&1 \
      | grep -E "median step|floor .* vs"
  done
done 2>&1 | tee "$OUT/decode.log"
