# Shared by the device drivers (split_run.sh, lsp_run.sh, nes_versus_run.sh): sourced, not run.
# stamp: a line with the seconds since the driver started; start_llamacpp_build JOBS [TARGETS]:
# the CUDA build (sm_90) of llama-server (or TARGETS) from .lcpp/lcpp.tgz in the background, detached (setsid), its
# log in /tmp/lcpp.log ending with "rc=N"; it builds while the model parts travel (or, where
# .lcpp/llama-server-sm90.tar.xz came along, unpacks that: tools/cuda/prebuild_peer.sh);
# quiet_build: the running build at the lowest priority, so a measurement taken meanwhile
# (echoline's host-side Python) is not slowed by 14 compiler jobs; build_modules NAME...:
# those kernels.cuda modules built by NVRTC in parallel.
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0))s] $*"; }

start_llamacpp_build() {
  if [ -f .lcpp/llama-server-sm90.tar.xz ]; then  # built here beforehand: no build in the lease
    unpack_prebuilt_llamacpp; return
  fi
  mkdir -p /tmp/lcpp && tar xzf .lcpp/lcpp.tgz -C /tmp/lcpp || return 1
  setsid nohup bash -c "cd /tmp/lcpp/llama.cpp && cmake -S . -B build -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_NUMBER=1 -DLLAMA_BUILD_COMMIT=0c1e570 > /tmp/lcpp.log 2>&1 \
    && cmake --build build -j ${1:-12} --target ${2:-llama-server} >> /tmp/lcpp.log 2>&1; echo \"rc=\$?\" >> /tmp/lcpp.log" \
    > /dev/null 2>&1 < /dev/null &
  echo $! > /tmp/lcpp.pgid  # setsid's child leads its own process group: the whole build
  stamp "llama.cpp build started"
}

unpack_prebuilt_llamacpp() {  # tools/cuda/prebuild_peer.sh's llama-server, behind a wrapper
  # that finds the device's own libcudart/libcublas 13 (the binary was linked elsewhere)
  local bin=/tmp/lcpp/llama.cpp/build/bin lib dirs=""
  mkdir -p $bin && tar xJf .lcpp/llama-server-sm90.tar.xz -C $bin && mv $bin/llama-server $bin/llama-server.bin || return 1
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
    local at
    at=$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')
    [ -n "$at" ] || at=$(find /usr/local /usr/lib /opt -name "$lib" 2>/dev/null | head -1)
    [ -n "$at" ] && case "$dirs:" in *":$(dirname "$at"):"*) ;; *) dirs="$dirs:$(dirname "$at")" ;; esac
  done
  printf '#!/bin/bash\nexport LD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\nexec "$(dirname "$0")/llama-server.bin" "$@"\n' \
    "${dirs#:}" > $bin/llama-server
  chmod +x $bin/llama-server
  if $bin/llama-server --version > /tmp/lcpp_version.log 2>&1; then
    echo "rc=0 (prebuilt by tools/cuda/prebuild_peer.sh; libraries from ${dirs#:})" > /tmp/lcpp.log
  else
    echo "rc=1 (prebuilt llama-server does not start: $(tail -2 /tmp/lcpp_version.log))" > /tmp/lcpp.log
  fi
  stamp "$(cat /tmp/lcpp.log)"
}

quiet_build() {
  [ -f /tmp/lcpp.pgid ] && ! grep -q "rc=" /tmp/lcpp.log 2>/dev/null || return 0
  renice -n 19 -g "$(cat /tmp/lcpp.pgid)" > /dev/null 2>&1 && stamp "build reniced to 19 while measuring"
}

build_modules() {  # NVRTC builds in parallel (CuPy's disk cache keeps them for the tests)
  local pids=()  # wait for these alone: a bare wait would also wait for the detached jobs
  for q in "$@"; do
    timeout 300 python3 -c "import sys; from echoline.kernels.cuda import load_module; load_module(sys.argv[1] or None)" "$q" > "/tmp/build_$q.log" 2>&1 &
    pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge 12 ]; do sleep 1; done
  done
  wait "${pids[@]}"; stamp "modules built"; grep -h -i -A5 error /tmp/build_*.log | head -40
}
