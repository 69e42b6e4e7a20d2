#!/usr/bin/env bash
# On the GPU machine: the quantized step's tiles compared inside its captured graph
# (`tilefuse bench --quant-tiles`, interleaved rounds in one process), then, if staged,
# `examples/quant_bandwidth` over QB_ARGS. Stage xz-compressed release binaries in
# .device/pairs: tf (the tilefuse CLI) and optionally qb. TILES lists `;;`-separated
# specs (each one `--quant-tiles` value), PRESET `preset:weights` (the 8B presets at
# context 512, 64 tokens), PROCS the processes to run.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$(pwd)/.device/pairs
(cd "$B" && for f in *.xz; do xz -d -f "$f"; done; chmod +x "$B"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
IFS=':' read -r preset weights <<<"${PRESET:-qwen3-8b:q4_k_m}"
extra=""; [[ $preset == qwen3-8b ]] && extra="--context 512 --tokens 64"
args=()
while IFS= read -r spec; do
  [[ -n $spec ]] && args+=(--quant-tiles "$spec")
done < <(sed 's/;;/\n/g' <<<"${TILES:-}")
for p in $(seq "${PROCS:-1}"); do
  echo "== process $p"
  "$B/tf" bench --preset "$preset" --weights "$weights" --no-eager $extra "${args[@]}" 2>&1 \
    | grep -vE "^\s*$"
done 2>&1 | tee "$OUT/tiles.log"
if [[ -x "$B/qb" && -n "${QB_ARGS:-}" ]]; then
  "$B/qb" $QB_ARGS 2>&1 | tail -40 | tee "$OUT/gemvs.log"
fi
