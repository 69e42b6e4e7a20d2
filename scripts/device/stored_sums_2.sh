#!/usr/bin/env bash
# GPU run 2 of the stored block sums: the quantized kernel and GGUF tests (GPU
# required), memcheck over the Q4_K GEMVs and the quantizing combine, then time to first
# token of short quantized prompts: multi-token GEMVs against every matrix dequantized,
# in one process each. Expects xz-compressed binaries in .device/t2.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$(pwd)/.device/t2
(cd "$B" && for f in *.xz; do xz -d -f "$f"; done; chmod +x "$B"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export TILEFUSE_REQUIRE_GPU=1
(
  cd engine
  "$B/kernels_quant" --test-threads=1 2>&1 | grep -vE "^\s*$" | tail -40
  "$B/gguf" --test-threads=1 2>&1 | grep -E "FAILED|panicked|test result|differ"
  /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$B/kernels_quant" q4_k_gemv quantizing 2>&1 | tail -2
) 2>&1 | tee "$OUT/tests.log"
for preset_prompts in "qwen3-0.6b:8 32 64" "qwen3-8b:8 32 64"; do
  preset=${preset_prompts%%:*}
  for p in ${preset_prompts#*:}; do
    echo "== $preset prompt $p"
    "$B/tf_new" bench --preset "$preset" --weights q4_k_m --prompt "$p" --prefill-only \
      --quant-gemv-tokens 64 2>&1 | grep -E "prefill|dequantized"
  done
done 2>&1 | tee "$OUT/bench.log"
