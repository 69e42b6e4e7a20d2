#!/usr/bin/env bash
# On the GPU machine: llama.cpp's batch-1 decode next to tilefuse's, same GPU, same call
# (staging: docs/gpu-testing.md, "Peers on the same machine"; results: docs/perf.md,
# "llama.cpp on the same H100").
#
# Stage in .device/lcpp: llama.cpp.tar.xz (llama.cpp's source: CMake files, ggml with its
# CPU and CUDA backends, src, common, vendor, tools/llama-bench and tools/quantize, and
# gguf-py) and cmake.tar.xz (cmake and ninja from PyPI's `cmake` and `ninja` wheels); and
# tf.xz, the tilefuse CLI, in .device/pairs. They unpack and build in $LCPP_WORK
# (default /tmp/lcpp), outside the carried paths, which each call replaces: a warm
# machine keeps the build between calls.
#
# CASES lists `preset:type:context:tokens` (default qwen3-0.6b:Q4_K_M:1024:128);
# ROUNDS the alternations of the two engines (default 2).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
L=$(pwd)/.device/lcpp
W=${LCPP_WORK:-/tmp/lcpp}; mkdir -p "$W"
B=$(pwd)/.device/pairs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [[ ! -x $W/build/bin/llama-bench ]]; then
  # Unpacked once: a build cut off by a call's time limit goes on in the next call, and
  # sources unpacked again (newer times) would make ninja start over.
  [[ -x $W/cmake/bin/cmake ]] || tar xJf "$L/cmake.tar.xz" -C "$W"
  [[ -f $W/src/CMakeLists.txt ]] || (mkdir -p "$W/src" && tar xJf "$L/llama.cpp.tar.xz" -C "$W/src")
  export PATH=$W/cmake/bin:/usr/local/cuda/bin:$PATH
  start=$(date +%s)
  cmake -S "$W/src" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  timeout "${BUILD_LIMIT:-540}" cmake --build "$W/build" --target llama-bench llama-quantize -j "$(nproc)" \
    >"$OUT/build.log" 2>&1 || { grep -m5 -A5 error "$OUT/build.log"; tail -5 "$OUT/build.log"; exit 1; }
  echo "llama.cpp built in $(( $(date +%s) - start )) s"
fi
[[ -f $B/tf.xz ]] && (cd "$B" && xz -d -f tf.xz && chmod +x tf)
for c in ${CASES:-qwen3-0.6b:Q4_K_M:1024:128}; do
  IFS=: read -r preset type context tokens <<<"$c"
  f16=/tmp/$preset-f16.gguf q=/tmp/$preset-$type.gguf
  if [[ ! -f $q ]]; then
    PYTHONPATH=$W/src/gguf-py python3 scripts/device/llama_cpp_model.py "$preset" "$f16" || exit 1
    "$W/build/bin/llama-quantize" "$f16" "$q" "$type" "$(nproc)" >"$OUT/quantize-$preset.log" 2>&1 \
      || { tail -20 "$OUT/quantize-$preset.log"; exit 1; }
    grep -E "model size|quant size" "$OUT/quantize-$preset.log"
    rm -f "$f16"
  fi
  weights=$(tr 'A-Z' 'a-z' <<<"$type")
  for round in $(seq "${ROUNDS:-2}"); do
    echo "== llama.cpp $preset $type depth $context, $tokens tokens, round $round"
    "$W/build/bin/llama-bench" -m "$q" -ngl 99 -fa 1 -p 0 -n "$tokens" -d "$context" -r 5 \
      -o md 2>&1 | grep -E "^\|"
    echo "== tilefuse $preset $weights context $context, $tokens tokens, round $round"
    "$B/tf" bench --preset "$preset" --weights "$weights" --no-eager --context "$context" \
      --tokens "$tokens" 2>&1 | grep -E "median step|floor .* vs|rror"
  done
done 2>&1 | tee "$OUT/peer.log"
