#!/usr/bin/env bash
# On the GPU machine: the quantized kernel and GGUF tests (GPU required),
# compute-sanitizer over the GEMVs, the multi-token GEMVs and the quantizing combine,
# then time to first token of short quantized prompts (multi-token GEMVs against every
# matrix dequantized for the GEMMs, one process each; docs/perf.md, "Short prompts of
# quantized models").
#
# Stage xz-compressed release binaries in .device/quant first (kernels_quant and gguf:
# the engine's test binaries; tilefuse: the CLI), then `run` this with carry
# [".device/quant"]. PROMPTS_SMALL / PROMPTS_LARGE / SHORT override the prompt lengths and
# the multi-token limit.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$(pwd)/.device/quant
(cd "$B" && for f in *.xz; do xz -d -f "$f"; done; chmod +x "$B"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export TILEFUSE_REQUIRE_GPU=1
SAN=/usr/local/cuda/bin/compute-sanitizer
(
  cd engine
  "$B/kernels_quant" --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
  "$B/gguf" --test-threads=1 2>&1 | grep -E "^test |test result|panicked|differ"
  $SAN --tool memcheck --error-exitcode 9 "$B/kernels_quant" gemv quantizing 2>&1 | tail -2
  $SAN --tool racecheck --error-exitcode 9 "$B/kernels_quant" multi_token quantizing 2>&1 | tail -2
  $SAN --tool memcheck --error-exitcode 9 "$B/gguf" short_chunks 2>&1 | tail -2
) 2>&1 | tee "$OUT/tests.log"
for preset_prompts in "qwen3-0.6b:${PROMPTS_SMALL:-8 32 64}" "qwen3-8b:${PROMPTS_LARGE:-8 32 64}"; do
  preset=${preset_prompts%%:*}
  for p in ${preset_prompts#*:}; do
    echo "== $preset prompt $p"
    "$B/tilefuse" bench --preset "$preset" --weights q4_k_m --prompt "$p" --prefill-only \
      --quant-gemv-tokens "${SHORT:-64}" 2>&1 | grep -E "prefill|dequantized"
  done
done 2>&1 | tee "$OUT/prefill.log"
