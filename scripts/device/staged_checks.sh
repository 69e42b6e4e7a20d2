#!/usr/bin/env bash
# On the GPU machine: `.stages(n)` loops (kernel-dsl's GPU tests, compute-sanitizer),
# the Q4_K GEMV tests at each staging depth (`TILEFUSE_Q4K_STAGES`), and the quantized
# GEMVs against the copy ceiling at each depth (docs/perf.md, "Loads staged ahead").
#
# Stage xz-compressed release binaries in .device/st first (tilefuse_dsl: kernel-dsl's
# unit-test binary; kernels_quant: the engine's test binary; quant_bandwidth: the
# example; tilefuse: the CLI), then `run` this with carry [".device/st"]. PART picks
# what runs: tests, gemvs, decode (default: tests gemvs). STAGES lists the depths.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$(pwd)/.device/st
(cd "$B" && for f in *.xz; do [[ -e "$f" ]] && xz -d -f "$f"; done; chmod +x "$B"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SAN=/usr/local/cuda/bin/compute-sanitizer
PART=${PART:-tests gemvs}
if [[ $PART == *tests* ]]; then
  (
    export TILEFUSE_REQUIRE_GPU=1
    cd kernel-dsl
    "$B/tilefuse_dsl" --test-threads=1 staged gpu_gemv 2>&1 | grep -E "^test |test result|panicked"
    $SAN --tool memcheck --error-exitcode 9 "$B/tilefuse_dsl" gpu_gemv_staged 2>&1 | tail -2
    $SAN --tool racecheck --error-exitcode 9 "$B/tilefuse_dsl" gpu_gemv_staged 2>&1 | tail -2
    cd ../engine
    for s in ${STAGES:-1 2 3 4}; do
      echo "== kernels_quant, TILEFUSE_Q4K_STAGES=$s"
      TILEFUSE_Q4K_STAGES=$s "$B/kernels_quant" --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
    done
    TILEFUSE_Q4K_STAGES=3 $SAN --tool memcheck --error-exitcode 9 "$B/kernels_quant" q4_k 2>&1 | tail -2
    TILEFUSE_Q4K_STAGES=3 $SAN --tool racecheck --error-exitcode 9 "$B/kernels_quant" q4_k_gemv 2>&1 | tail -2
  ) 2>&1 | tee "$OUT/tests.log"
fi
if [[ $PART == *gemvs* ]]; then
  for s in ${STAGES:-1 2 3 4}; do
    echo "== quant_bandwidth, TILEFUSE_Q4K_STAGES=$s"
    TILEFUSE_Q4K_STAGES=$s "$B/quant_bandwidth" ${QB_ARGS:-} 2>&1 | grep -E "^\| Q4_K|^\| type|copy ceiling"
  done 2>&1 | tee "$OUT/gemvs.log"
fi
if [[ $PART == *decode* ]]; then
  for round in $(seq "${ROUNDS:-2}"); do
    for s in ${STAGES:-1 3}; do
      echo "== qwen3-8b, TILEFUSE_Q4K_STAGES=$s, round $round"
      TILEFUSE_Q4K_STAGES=$s "$B/tilefuse" bench --preset qwen3-8b --weights q4_k_m --no-eager \
        --context 512 --tokens 64 2>&1 | grep -E "median step|floor .* vs"
      echo "== qwen3-0.6b, TILEFUSE_Q4K_STAGES=$s, round $round"
      TILEFUSE_Q4K_STAGES=$s "$B/tilefuse" bench --preset qwen3-0.6b --weights q4_k_m --no-eager \
        2>&1 | grep -E "median step|floor .* vs"
    done
  done 2>&1 | tee "$OUT/decode.log"
fi
