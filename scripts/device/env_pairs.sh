#!/usr/bin/env bash
# On the GPU machine: one build's decode step under several environments, interleaved
# in rounds (docs/perf.md's method: one process a run, bf16 timed first in each).
# Stage xz-compressed release binaries in .device/pairs: tf (the tilefuse CLI),
# optionally kernels_quant, gguf, kernels and engine_api (the engine's test binaries,
# run first with a GPU required unless SKIP_TESTS is set; SANITIZE=`binary:filter` then runs those tests
# under compute-sanitizer memcheck) and
# qb (examples/quant_bandwidth; QB_RUNS lists `label|ENV=v ..|args` runs of it).
# VARIANTS lists `label|ENV=v ENV2=w` (`-` for none), PRESET `preset:weights`, ROUNDS
# the rounds (the 8B presets at context 512, 64 tokens). `TF_BIN=name` (`QB_BIN=name`
# in a QB run) among a variant's settings runs another staged binary, so that two
# builds pair up the same way. `dsl` (the dsl's test binary) runs with the tests.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$(pwd)/.device/pairs
(cd "$B" && for f in *.xz; do xz -d -f "$f"; done; chmod +x "$B"/*)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# The binary a run's settings name (`TF_BIN=x` or `QB_BIN=x`), or the default.
pick() { local key=$1 def=$2 envs=$3; local v
  v=$(tr ' ' '\n' <<<"$envs" | sed -n "s/^$key=//p"); echo "$B/${v:-$def}"; }
for t in kernels_quant gguf kernels engine_api dsl; do
  [[ -x "$B/$t" && -z "${SKIP_TESTS:-}" ]] || continue
  dir=engine; [[ $t == dsl ]] && dir=kernel-dsl
  (cd $dir && TILEFUSE_REQUIRE_GPU=1 "$B/$t" --test-threads=1 2>&1 \
    | grep -E "^test |test result|panicked") | tee -a "$OUT/tests.log"
done
# SANITIZE=`binary:filter`: compute-sanitizer memcheck over those tests.
if [[ -n "${SANITIZE:-}" ]]; then
  IFS=':' read -r t filter <<<"$SANITIZE"
  (cd engine && TILEFUSE_REQUIRE_GPU=1 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
    "$B/$t" --test-threads=1 $filter 2>&1 | grep -E "ERROR SUMMARY|^test |test result|panicked") \
    | tee "$OUT/sanitizer.log"
fi
if [[ -x "$B/qb" && -n "${QB_RUNS:-}" ]]; then
  IFS=';' read -ra runs <<<"$QB_RUNS"
  for r in "${runs[@]}"; do
    IFS='|' read -r label envs args <<<"$r"
    [[ $envs == - ]] && envs=""
    echo "== qb $label ($envs) $args"
    env $envs "$(pick QB_BIN qb "$envs")" $args 2>&1 | grep -E "^\| Q|copy ceiling|rror"
  done 2>&1 | tee "$OUT/gemvs.log"
fi
IFS=':' read -r preset weights <<<"${PRESET:-qwen3-8b:q4_k_m}"
extra=""; [[ $preset == qwen3-8b ]] && extra="--context 512 --tokens 64"
IFS=';' read -ra variants <<<"${VARIANTS:-default|-}"
for round in $(seq "${ROUNDS:-1}"); do
  for v in "${variants[@]}"; do
    IFS='|' read -r label envs <<<"$v"
    [[ $envs == - ]] && envs=""
    echo "== $label ($envs) $preset $weights round $round"
    env $envs "$(pick TF_BIN tf "$envs")" bench --preset "$preset" --weights "$weights" --no-eager $extra 2>&1 \
      | grep -E "median step|floor .* vs|rror"
  done
done 2>&1 | tee "$OUT/decode.log"
