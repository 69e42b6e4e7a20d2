#!/usr/bin/env bash
# On the GPU machine: the quantized O projection's words prefetched to L2 during the
# attention (TILEFUSE_PREFETCH_WORDS, KiB; docs/perf.md "The O projection's words
# prefetched"), one process a setting, interleaved, bf16 first in each; first the
# engine's kernel tests (the attention with both prefetch ranges, GPU required) and
# compute-sanitizer memcheck over the attention tests.
#
# Stage xz-compressed release binaries in .device/pf: tilefuse (the CLI) and kernels
# (the engine's test binary); then `run` this with carry [".device/pf"]. SETTINGS lists
# the KiB (default "0 4096 8192"), ROUNDS the rounds (default 1), PRESETS the presets
# (default qwen3-8b; 8B at context 512, 64 tokens).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$(pwd)/.device/pf
(cd "$B" && for f in *.xz; do xz -d -f "$f"; done; chmod +x "$B"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [[ -x "$B/kernels" ]]; then
  (cd engine && export TILEFUSE_REQUIRE_GPU=1 \
    && "$B/kernels" --test-threads=1 attention 2>&1 | grep -E "^test |test result|panicked" \
    && /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$B/kernels" attention_qwen3_shape_on_gpu 2>&1 | tail -2) | tee "$OUT/tests.log"
fi
for round in $(seq "${ROUNDS:-1}"); do
  for preset in ${PRESETS:-qwen3-8b}; do
    extra=""; [[ $preset == qwen3-8b ]] && extra="--context 512 --tokens 64"
    for kib in ${SETTINGS:-0 4096 8192}; do
      echo "== $preset words $kib KiB round $round"
      TILEFUSE_PREFETCH_WORDS=$kib "$B/tilefuse" bench --preset "$preset" --weights q4_k_m \
        --no-eager $extra 2>&1 | grep -E "median step|floor .* vs|rror"
    done
  done
done 2>&1 | tee "$OUT/decode.log"
