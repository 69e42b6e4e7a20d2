#!/usr/bin/env bash
# GPU run for the multi-token GEMVs of short quantized prompts: the kernel and prefill
# tests (GPU required), compute-sanitizer over the new kernels, then time to first token
# with the multi-token GEMVs and with every matrix dequantized, in one process each.
# Expects xz-compressed binaries in .device/q (tilefuse, gguf, kernels_quant).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
Q=$(pwd)/.device/q
(cd "$Q" && for f in *.xz; do xz -d -f "$f"; done; chmod +x "$Q"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
export TILEFUSE_REQUIRE_GPU=1
SAN=/usr/local/cuda/bin/compute-sanitizer
(
  cd engine
  "$Q/kernels_quant" --test-threads=1 2>&1 | tail -4
  "$Q/gguf" --test-threads=1 2>&1 | tail -4
  "$Q/gguf" short_chunks --nocapture 2>&1 | grep -E "relative|test result"
  $SAN --tool memcheck --error-exitcode 9 "$Q/kernels_quant" multi_token 2>&1 | tail -3
  $SAN --tool racecheck --error-exitcode 9 "$Q/kernels_quant" multi_token 2>&1 | tail -3
  $SAN --tool memcheck --error-exitcode 9 "$Q/gguf" short_chunks 2>&1 | tail -3
) 2>&1 | tee "$OUT/tests.log"
for preset_prompts in "qwen3-0.6b:${SMALL_PROMPTS:-8 32 64}" "qwen3-8b:${LARGE_PROMPTS:-8 32}"; do
  preset=${preset_prompts%%:*}
  for p in ${preset_prompts#*:}; do
    echo "== $preset prompt $p"
    "$Q/tilefuse" bench --preset "$preset" --weights q4_k_m --prompt "$p" --prefill-only \
      --quant-gemv-tokens "${SHORT:-64}" 2>&1 | grep -vE "^\s*$"
  done
done 2>&1 | tee "$OUT/bench.log"
