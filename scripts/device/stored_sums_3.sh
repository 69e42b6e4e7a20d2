#!/usr/bin/env bash
# GPU run 3 of the stored block sums: the quantized decode step of the previous build
# (tf_old) and this one (tf_new), interleaved in pairs, bf16 timed first in each
# process. Expects xz-compressed binaries in .device/t3.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$(pwd)/.device/t3
(cd "$B" && for f in *.xz; do xz -d -f "$f"; done; chmod +x "$B"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for round in 1 2; do
  for b in tf_old tf_new; do
    echo "== $b qwen3-8b round $round"
    "$B/$b" bench --preset qwen3-8b --weights q4_k_m --no-eager --context 512 --tokens 64 2>&1 \
      | grep -E "median step|floor .* vs"
    echo "== $b qwen3-0.6b round $round"
    "$B/$b" bench --preset qwen3-0.6b --weights q4_k_m --no-eager 2>&1 \
      | grep -E "median step|floor .* vs"
  done
done 2>&1 | tee "$OUT/decode.log"
