#!/usr/bin/env bash
# On the GPU machine: `.stages(n)` loops. kernel-dsl's GPU tests of staged and
# prefetching GEMV loops against the interpreter, compute-sanitizer (memcheck and
# racecheck) over the staged one, then the staged stream against the plain loop and the
# copy ceiling (docs/perf.md, "Loads staged ahead").
#
# Stage kernel-dsl's xz-compressed release unit-test binary as .device/st/tilefuse_dsl.xz
# (`cargo test --release --no-run -p tilefuse-dsl --lib`, stripped), then `run` this with
# carry [".device/st"].
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$(pwd)/.device/st
(cd "$B" && for f in *.xz; do [[ -e "$f" ]] && xz -d -f "$f"; done; chmod +x "$B"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SAN=/usr/local/cuda/bin/compute-sanitizer
cd kernel-dsl
(
  export TILEFUSE_REQUIRE_GPU=1
  "$B/tilefuse_dsl" --test-threads=1 staged gpu_gemv 2>&1 | grep -E "^test |test result|panicked"
  $SAN --tool memcheck --error-exitcode 9 "$B/tilefuse_dsl" gpu_gemv_staged 2>&1 | tail -2
  $SAN --tool racecheck --error-exitcode 9 "$B/tilefuse_dsl" gpu_gemv_staged 2>&1 | tail -2
  "$B/tilefuse_dsl" --ignored staged_stream_bandwidth --nocapture 2>&1 | grep -E "copy ceiling|stages"
) 2>&1 | tee "$OUT/staged.log"
