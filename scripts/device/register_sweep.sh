#!/usr/bin/env bash
# On the GPU machine: the quantized GEMVs alone at Qwen3-8B's shapes under run-time
# register limits (TILEFUSE_MAX_REGISTERS, docs/language.md "Register limits at run
# time"), every configuration timed (`quant_bandwidth --8b --sweep`), one process a
# limit; then, if a tilefuse CLI is staged, the 8B Q4_K_M step with the attribute's
# limits against every variant uncapped, interleaved.
#
# Stage xz-compressed release binaries in .device/regs first: quant_bandwidth (the
# example), optionally kernels_quant (the engine's test binary, run first) and tilefuse
# (the CLI); then `run` this with carry [".device/regs"]. LIMITS lists the limits
# (default "248 96 80 72 64"; 248 is no limit below the per-program maximum), KERNELS
# the kernels they apply to, STEP_ROUNDS the step's pairs (default 1).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$(pwd)/.device/regs
(cd "$B" && for f in *.xz; do xz -d -f "$f"; done; chmod +x "$B"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [[ -x "$B/kernels_quant" ]]; then
  (cd engine && TILEFUSE_REQUIRE_GPU=1 "$B/kernels_quant" --test-threads=1 2>&1 \
    | grep -E "^test |test result|panicked") | tee "$OUT/tests.log"
fi
rules() { local r=""; for k in ${KERNELS:-q4_k_gemv q6_k_gemv q8_0_gemv}; do r="$r$k=$1;"; done; echo "$r"; }
for limit in ${LIMITS:-248 96 80 72 64}; do
  echo "== limit $limit"
  TILEFUSE_MAX_REGISTERS=$(rules "$limit") "$B/quant_bandwidth" --8b --sweep 2>&1 \
    | grep -E "^\| Q|copy ceiling|µs$|rror"
done 2>&1 | tee "$OUT/sweep.log"
if [[ -x "$B/tilefuse" ]]; then
  for round in $(seq "${STEP_ROUNDS:-1}"); do
    for setting in attribute uncapped; do
      echo "== qwen3-8b $setting round $round"
      env $([[ $setting == uncapped ]] && echo "TILEFUSE_MAX_REGISTERS=q4_k_gemv=255") \
        "$B/tilefuse" bench --preset qwen3-8b --weights q4_k_m --no-eager --context 512 \
        --tokens 64 2>&1 | grep -E "median step|floor .* vs|rror"
    done
  done 2>&1 | tee "$OUT/step.log"
fi
