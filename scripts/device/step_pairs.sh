#!/usr/bin/env bash
# On the GPU machine: two builds' decode steps in interleaved pairs (docs/perf.md's
# method), bf16 timed first in each process. Stage xz-compressed release binaries in
# .device/pairs: tf_old and tf_new (the tilefuse CLI of each build), optionally
# kernels_quant (the new build's engine test binary, run first with a GPU required)
# and qb_new (its examples/quant_bandwidth, run once at Qwen3-8B's shapes). CASES lists
# `preset:weights:rounds` (default qwen3-8b:q4_k_m:2 qwen3-8b:q8_0:1 qwen3-0.6b:q4_k_m:1;
# the 8B presets at context 512, 64 tokens).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$(pwd)/.device/pairs
(cd "$B" && for f in *.xz; do xz -d -f "$f"; done; chmod +x "$B"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [[ -x "$B/kernels_quant" ]]; then
  (cd engine && TILEFUSE_REQUIRE_GPU=1 "$B/kernels_quant" --test-threads=1 2>&1 \
    | grep -E "^test |test result|panicked") | tee "$OUT/tests.log"
fi
if [[ -x "$B/qb_new" ]]; then
  "$B/qb_new" --8b 2>&1 | grep -E "^\| Q|copy ceiling" | tee "$OUT/gemvs.log"
fi
for c in ${CASES:-qwen3-8b:q4_k_m:2 qwen3-8b:q8_0:1 qwen3-0.6b:q4_k_m:1}; do
  IFS=: read -r preset weights rounds <<<"$c"
  extra=""; [[ $preset == qwen3-8b ]] && extra="--context 512 --tokens 64"
  for round in $(seq "$rounds"); do
    for b in old new; do
      echo "== $b $preset $weights round $round"
      "$B/tf_$b" bench --preset "$preset" --weights "$weights" --no-eager $extra 2>&1 \
        | grep -E "median step|floor .* vs|rror"
    done
  done
done 2>&1 | tee "$OUT/decode.log"
