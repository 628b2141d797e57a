#!/usr/bin/env bash
# Builds llama.cpp's own tools (llama-quantize, llama-bench, llama-batched-bench, llama-server)
# from the source inside the pinned llama-cpp-python sdist, for the benchmarks that measure
# MiniServe beside llama.cpp on the same GGUF file, and installs them outside the repository.
#
#   scripts/build_llama_cpp.sh [PREFIX]        # PREFIX defaults to $MINISERVE_LLAMA_PREFIX or /work/llama-bin
#
# PREFIX gets the binaries and their shared libraries, plus llama.cpp's converter
# (PREFIX/convert_hf_to_gguf.py with its conversion/ and gguf-py/ beside it), which
# `python -m bench.models --sizes` runs; the converter needs sentencepiece (requirements-dev.txt).
# The CPU features are named instead of detected (-DGGML_NATIVE=OFF): on a virtual machine
# whose CPU hides part of what the compiler detects, a native build dies with an illegal
# instruction. So they are read from /proc/cpuinfo's flags, the ones the virtual CPU admits to.
# AMX is left off: on an Intel Xeon VM that lists amx_tile and amx_int8, llama.cpp's AMX matmul
# (ggml_backend_amx_mul_mat) died with an illegal instruction at its tilezero.
# Two phases, each installed when done: the small tools first (the GGUF files can be built and
# llama-bench run while the rest compiles), then llama-server (its multimodal library and web
# UI are most of the build). It is long on 2 cores, so it runs niced; JOBS sets the parallelism,
# BUILD_DIR a folder to keep (a rerun there resumes where an interrupted build stopped).
set -euo pipefail
PREFIX="${1:-${MINISERVE_LLAMA_PREFIX:-/work/llama-bin}}"
PIN="${LLAMA_CPP_PIN:-llama-cpp-python==0.3.36}"
JOBS="${JOBS:-2}"
PYTHON="${PYTHON:-python3}"
WORK="${BUILD_DIR:-$(mktemp -d -t llama-build-XXXX)}"
SMALL=(llama-quantize llama-bench llama-batched-bench)

command -v cmake >/dev/null && command -v ninja >/dev/null || {
    echo "need cmake and ninja (apt-get install cmake ninja-build, or pip install cmake ninja)" >&2; exit 1; }

echo "build dir: $WORK"
mkdir -p "$WORK" && cd "$WORK"
if [ ! -d src ]; then
    "$PYTHON" -m pip download --no-binary :all: --no-deps -d sdist "$PIN"
    mkdir -p src && tar -xzf sdist/*.tar.gz -C src --strip-components=1
fi
LLAMA=src/vendor/llama.cpp
has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
cmake -S "$LLAMA" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VNNI="$(has avx512_vnni)" \
    -DGGML_AVX512_BF16="$(has avx512_bf16)" -DGGML_AVX_VNNI="$(has avx_vnni)" \
    -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON \
    -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON

install_bins() {
    mkdir -p "$PREFIX"
    for bin in "$@"; do cp build/bin/"$bin" "$PREFIX"/; done
    find build -name '*.so*' -exec cp -P {} "$PREFIX"/ \;
}

nice -n 15 ninja -C build -j "$JOBS" "${SMALL[@]}"
install_bins "${SMALL[@]}"
cp "$LLAMA"/convert_hf_to_gguf.py "$PREFIX"/
for dir in conversion gguf-py; do rm -rf "${PREFIX:?}/$dir" && cp -r "$LLAMA/$dir" "$PREFIX/$dir"; done
"$PREFIX/llama-bench" --version 2>&1 | grep -m1 version: || true
echo "installed ${SMALL[*]} and the converter into $PREFIX"

nice -n 15 ninja -C build -j "$JOBS" llama-server
install_bins llama-server
echo "installed llama-server into $PREFIX"
