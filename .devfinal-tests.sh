#!/usr/bin/env bash
# Call 1: every GPU test binary, then compute-sanitizer on the new kernels.
set -u
cd "$(dirname "$0")"
D=.devfinal
tar xJf $D/bins.txz -C $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
$D/run-tests > $OUT/tests.log 2>&1; echo "run-tests rc=$?" >> $OUT/tests.log
grep -E "^== |test result|FAILED|panicked|rc=" $OUT/tests.log | tail -80
S=/usr/local/cuda/bin/compute-sanitizer
n=$(grep -P "\tnum_stages\t|-num_stages\t" $D/manifest.tsv | cut -f1 | head -1)
( timeout 150 $S --tool memcheck $D/bin/$n 2>&1 | tail -3
  timeout 200 $S --tool memcheck $D/bin/example-tilefuse-matmul --small 2>&1 | tail -3
  timeout 120 $S --tool racecheck $D/bin/example-tilefuse-matmul --small 2>&1 | tail -3 ) > $OUT/sanitizer.log 2>&1
cat $OUT/sanitizer.log
