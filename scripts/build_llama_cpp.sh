#!/usr/bin/env bash
# Builds llama.cpp's own tools (llama-bench, llama-server, llama-quantize, llama-batched-bench)
# from the source inside the pinned llama-cpp-python sdist, for the benchmarks that measure
# MiniServe beside llama.cpp on the same GGUF file, and installs them outside the repository.
#
#   scripts/build_llama_cpp.sh [PREFIX]        # PREFIX defaults to $MINISERVE_LLAMA_PREFIX or /work/llama-bin
#
# PREFIX gets the binaries and their shared libraries, plus llama.cpp's converter
# (PREFIX/convert_hf_to_gguf.py, with PREFIX/gguf-py beside it) that bench.model_sizes runs.
# The CPU features are named instead of detected (-DGGML_NATIVE=OFF): on a virtual machine
# whose CPU hides part of what the compiler detects, a native build dies with an illegal
# instruction. Drop the AVX-512 flags on a CPU without them. The build is long on 2 cores,
# so it runs niced; set JOBS to change its parallelism.
set -euo pipefail
PREFIX="${1:-${MINISERVE_LLAMA_PREFIX:-/work/llama-bin}}"
PIN="${LLAMA_CPP_PIN:-llama-cpp-python==0.3.36}"
JOBS="${JOBS:-2}"
PYTHON="${PYTHON:-python3}"
WORK="${BUILD_DIR:-$(mktemp -d -t llama-build-XXXX)}"

command -v cmake >/dev/null && command -v ninja >/dev/null || {
    echo "need cmake and ninja (apt-get install cmake ninja-build, or pip install cmake ninja)" >&2; exit 1; }

echo "build dir: $WORK"
cd "$WORK"
if [ ! -d src ]; then
    "$PYTHON" -m pip download --no-binary :all: --no-deps -d sdist "$PIN"
    mkdir -p src && tar -xzf sdist/*.tar.gz -C src --strip-components=1
fi
cmake -S src/vendor/llama.cpp -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
    -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON \
    -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
nice -n 15 ninja -C build -j "$JOBS" llama-bench llama-server llama-quantize llama-batched-bench

mkdir -p "$PREFIX"
cp build/bin/llama-bench build/bin/llama-server build/bin/llama-quantize build/bin/llama-batched-bench "$PREFIX"/
find build -name '*.so*' -exec cp -P {} "$PREFIX"/ \;
cp src/vendor/llama.cpp/convert_hf_to_gguf.py "$PREFIX"/
rm -rf "$PREFIX/gguf-py" && cp -r src/vendor/llama.cpp/gguf-py "$PREFIX/gguf-py"
"$PREFIX/llama-bench" --version 2>&1 | grep -m1 version: || true
echo "installed into $PREFIX"
