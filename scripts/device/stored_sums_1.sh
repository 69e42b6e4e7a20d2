#!/usr/bin/env bash
# GPU run 1 of the stored block sums: the quantized kernel and GGUF tests (GPU
# required), compute-sanitizer over the GEMVs and the quantizing combine, then the
# GEMVs alone at Qwen3-8B's shapes, the previous build (qb_old) and this one (qb_new)
# interleaved. Expects xz-compressed binaries in .device/t1.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$(pwd)/.device/t1
(cd "$B" && for f in *.xz; do xz -d -f "$f"; done; chmod +x "$B"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export TILEFUSE_REQUIRE_GPU=1
SAN=/usr/local/cuda/bin/compute-sanitizer
(
  cd engine
  "$B/kernels_quant" --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
  "$B/gguf" --test-threads=1 2>&1 | grep -E "FAILED|panicked|test result"
  $SAN --tool memcheck --error-exitcode 9 "$B/kernels_quant" q4_k_gemv q6_k_gemv quantizing 2>&1 | tail -2
  $SAN --tool racecheck --error-exitcode 9 "$B/kernels_quant" quantizing q4_k_and 2>&1 | tail -2
) 2>&1 | tee "$OUT/tests.log"
for round in 1 2; do
  for b in qb_old qb_new; do
    echo "== $b round $round"
    "$B/$b" --8b 2>&1 | grep -E "^\| Q|copy ceiling"
  done
done 2>&1 | tee "$OUT/qb.log"
