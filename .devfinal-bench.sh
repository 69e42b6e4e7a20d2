#!/usr/bin/env bash
# Call 2: benches (the machine is warm from call 1; binaries already unpacked).
set -u
cd "$(dirname "$0")"
D=.devfinal
[ -d $D/bin ] || tar xJf $D/bins.txz -C $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
T=$D/bin/bin-tilefuse-tilefuse
( timeout 120 $D/bin/example-tilefuse-tutorial_03_matmul 2>&1 | tail -6
  TILEFUSE_SPECIALIZE=0 timeout 120 $D/bin/example-tilefuse-tutorial_03_matmul 2>&1 | tail -6 ) > $OUT/tutorial.txt 2>&1
cat $OUT/tutorial.txt
for r in 1 2; do for sp in 1 0; do for p in 512 2048; do
  echo "== prompt $p SPECIALIZE=$sp round $r"; TILEFUSE_SPECIALIZE=$sp timeout 100 $T bench --preset qwen3-0.6b --prompt $p --prefill-only 2>&1 | tail -2
done; done; done > $OUT/prefill.txt 2>&1
for p in 1024 8192; do echo "== prompt $p"; timeout 150 $T bench --preset qwen3-0.6b --prompt $p --prefill-only 2>&1 | tail -2; done >> $OUT/prefill.txt 2>&1
cat $OUT/prefill.txt
timeout 120 $T bench --preset qwen3-0.6b --no-eager > $OUT/decode.txt 2>&1; tail -4 $OUT/decode.txt
timeout 150 $T bench --preset qwen3-0.6b --weights q4_k_m --no-eager > $OUT/quant.txt 2>&1; tail -8 $OUT/quant.txt
timeout 200 $T bench --preset qwen3-8b --weights q4_k_m --no-eager --context 512 --tokens 64 > $OUT/quant8b.txt 2>&1; tail -8 $OUT/quant8b.txt
