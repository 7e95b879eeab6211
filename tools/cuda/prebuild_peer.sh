#!/bin/bash
# llama-server's CUDA build (sm_90, the H100/H200) made HERE, on a machine without a GPU, so a
# device lease need not spend 13 of its minutes building it: the side by side on the embedded
# 7B file then fits one short lease. Dev-only, like every peer build (never a dependency).
#
#   bash tools/cuda/prebuild_peer.sh        # configure (once) and build; resumes a stopped build
#   -> .lcpp/llama-server-sm90.tar.xz       # carried beside .lcpp/lcpp.tgz; device_common.sh's
#                                             start_llamacpp_build unpacks it instead of building
#
# Needs nvcc 13.0 here (the devices' toolkit and driver are 13.0) and the llama.cpp sources of
# .lcpp/lcpp.tgz (from the llama-cpp-python sdist, tools/llamacpp_peer.py). What the local
# toolkit lacks is supplied without touching it:
#   - cuBLAS headers and libraries: the nvidia-cublas 13.0 wheel (unpacked, no code run);
#   - libcuda.so: a link-time stand-in exporting the driver calls ggml-cuda makes (its virtual
#     memory pool); at run time the device's own driver library is the one loaded;
# both joined to a symlinked copy of the toolkit (~/.cache/echoline-peer/cuda13-root).
# Static ggml/llama libraries, so the binary needs only the device's libcudart/libcublas 13
# (device_common.sh finds them and wraps the binary). Two cores (Zen 3): 51 minutes from
# scratch; an 82 MB binary, 43 MB as .tar.xz (carried alone with .whl and the tokenizer keys).
set -e
CACHE=~/.cache/echoline-peer
TOOLKIT=${CUDA_HOME:-/usr/local/cuda-13.0}
R=$CACHE/cuda13-root
SRC=$CACHE/llama-cuda
REPO=$(cd "$(dirname "$0")/../.." && pwd)

if [ ! -f "$R/lib/stubs/libcuda.so" ]; then
  mkdir -p "$CACHE/cublas-wheel"
  W=$CACHE/cublas-wheel/nvidia_cublas-13.0.2.14-py3-none-manylinux_2_27_x86_64.whl
  [ -f "$W" ] || python3 -m pip download -q --no-deps --only-binary :all: "nvidia-cublas==13.0.2.14" \
    --platform manylinux_2_27_x86_64 -d "$CACHE/cublas-wheel"
  echo "0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c  $W" | sha256sum -c -
  python3 -m zipfile -e "$W" "$CACHE/cuda-cublas"
  C=$CACHE/cuda-cublas/nvidia/cu13
  rm -rf "$R" && mkdir -p "$R" && cp -as "$TOOLKIT/." "$R/"
  # cp -as copies the toolkit's own symlinks as they are (absolute, into the real toolkit):
  # point them back inside the copy, so nothing below writes into the real one
  rm "$R/lib64" && ln -s lib "$R/lib64"
  (cd "$R/targets/x86_64-linux" && rm include lib && ln -s ../../include include && ln -s ../../lib lib)
  for f in "$C"/include/*.h; do ln -sf "$f" "$R/include/"; done
  for f in "$C"/lib/*.so.13; do ln -sf "$f" "$R/lib/"; ln -sf "$f" "$R/lib/$(basename "$f" .13)"; done
  mkdir -p "$R/lib/stubs"
  {
    echo "/* link-time stand-in for libcuda.so.1: the device's driver library is loaded at run time */"
    for n in cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree cuMemAddressReserve \
      cuMemCreate cuMemGetAllocationGranularity cuMemMap cuMemRelease cuMemSetAccess cuMemUnmap; do
      echo "int $n(void) { return 0; }"
    done
  } > "$R/lib/stubs/cuda_stub.c"
  gcc -shared -fPIC -o "$R/lib/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 "$R/lib/stubs/cuda_stub.c"
fi

if [ ! -f "$SRC/llama.cpp/build/CMakeCache.txt" ]; then
  mkdir -p "$SRC" && tar xzf "$REPO/.lcpp/lcpp.tgz" -C "$SRC"
  (cd "$SRC/llama.cpp" && CUDACXX=$R/bin/nvcc cmake -S . -B build -DGGML_CUDA=ON -DCUDAToolkit_ROOT="$R" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_NUMBER=1 -DLLAMA_BUILD_COMMIT=0c1e570 -DBUILD_SHARED_LIBS=OFF)
fi
(cd "$SRC/llama.cpp" && nice -n 5 cmake --build build -j "$(nproc)" --target llama-server)
BIN=$SRC/llama.cpp/build/bin/llama-server
ldd "$BIN" | grep -E "cuda|cublas" || true
mkdir -p "$REPO/.lcpp"
tar cJf "$REPO/.lcpp/llama-server-sm90.tar.xz" -C "$(dirname "$BIN")" llama-server
ls -l "$REPO/.lcpp/llama-server-sm90.tar.xz"
