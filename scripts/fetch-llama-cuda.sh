#!/usr/bin/env bash
# The CUDA backend of the pinned llama.cpp (libggml-cuda.so) for machines with an NVIDIA GPU. Prints the folder
# that holds it on stdout, or nothing when this machine gets no GPU backend. The build copies it next to the
# binary; at run time keepwarm loads it when a CUDA device is present and stays on the CPU otherwise.
#
#   KEEPWARM_GPU=auto (default)   the CUDA backend when this machine has an NVIDIA driver
#   KEEPWARM_GPU=cuda             always (building for a GPU machine elsewhere)
#   KEEPWARM_GPU=cpu              never
#   KEEPWARM_CUDA_BUILD=prebuilt  the libggml-cuda.so of @node-llama-cpp/linux-x64-cuda (same llama.cpp commit as the
#                                 CPU libraries, integrity-pinned, from the npm registry)
#   KEEPWARM_CUDA_BUILD=source    compiled here from the pinned source with nvcc, for KEEPWARM_CUDA_ARCH (e.g. 90;
#                                 default: the compute capabilities nvidia-smi reports)
#   (unset)                       source when nvcc is present and a GPU here has no machine code in the prebuilt:
#                                 it holds sm_86, sm_89, sm_120a and sm_121a; any other GPU (Hopper's sm_90, Ampere's
#                                 sm_80) runs PTX that the driver compiles at first use, for minutes
#
# The prebuilt needs the CUDA 13 runtime (libcudart.so.13, libcublas.so.13) and a driver that supports it (580 or
# newer). Cached outside the build tree, keyed by release, and for a source build by architectures and nvcc version.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NLC_VERSION=3.21.1
LLAMA_COMMIT=80fb11a
# `npm view @node-llama-cpp/linux-x64-cuda@3.21.1 dist.integrity`
CUDA_INTEGRITY='sha512-idsE55VoD/FbvLhnBC9krUJaUoC0XnebseAAnCpm/brKf61HEbu+idgbb5eN6mxkjLSrHtILprJ0nDcUJjVrFg=='
PREBUILT_SASS="86 89 120 121"  # compute capabilities the prebuilt holds machine code for

log() { echo "fetch-llama-cuda: $*" >&2; }
cache_root="${KEEPWARM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/keepwarm}"

has_nvidia_driver() { [[ -e /proc/driver/nvidia/version ]] || nvidia-smi -L >/dev/null 2>&1; }
# "9.0" -> "90", one per GPU, deduplicated.
gpu_architectures() {
    nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' | sort -u
}
find_nvcc() {
    command -v nvcc 2>/dev/null || { [[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda/bin/nvcc; } || true
}

gpu="${KEEPWARM_GPU:-auto}"
case "$gpu" in
    cpu) exit 0 ;;
    auto) has_nvidia_driver || exit 0 ;;
    cuda) ;;
    *) log "KEEPWARM_GPU=$gpu: expected auto, cuda or cpu"; exit 2 ;;
esac

mode="${KEEPWARM_CUDA_BUILD:-}"
if [[ -z "$mode" ]]; then
    mode=prebuilt
    if [[ -n "$(find_nvcc)" ]]; then
        for arch in $(gpu_architectures); do
            [[ " $PREBUILT_SASS " == *" $arch "* ]] || { mode=source; log "GPU sm_$arch: not in the prebuilt, building"; }
        done
    fi
fi

# shellcheck source=integrity.sh
source "$here/integrity.sh"

fetch_prebuilt() {
    local dest="$cache_root/llama.cpp-$LLAMA_COMMIT-nlc$NLC_VERSION-linux-x64-cuda"
    if [[ -f "$dest/.complete" ]]; then echo "$dest"; return; fi
    local work
    work="$(mktemp -d "${TMPDIR:-/tmp}/keepwarm-cuda.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    log "downloading @node-llama-cpp/linux-x64-cuda@$NLC_VERSION from the npm registry (143 MB)"
    (cd "$work" && npm pack --silent "@node-llama-cpp/linux-x64-cuda@$NLC_VERSION" >&2)
    verify "$work/node-llama-cpp-linux-x64-cuda-$NLC_VERSION.tgz" "$CUDA_INTEGRITY"
    tar xzf "$work/node-llama-cpp-linux-x64-cuda-$NLC_VERSION.tgz" -C "$work" \
        package/bins/linux-x64-cuda/libggml-cuda.so package/bins/linux-x64-cuda/_nlcBuildMetadata.json
    rm -rf "$dest.partial"
    mkdir -p "$dest.partial"
    mv "$work"/package/bins/linux-x64-cuda/* "$dest.partial/"
    touch "$dest.partial/.complete"
    rm -rf "$dest"
    mv "$dest.partial" "$dest"
    log "cached in $dest"
    echo "$dest"
}

build_from_source() {
    local nvcc archs
    nvcc="$(find_nvcc)"
    [[ -n "$nvcc" ]] || { log "KEEPWARM_CUDA_BUILD=source needs nvcc (CUDA toolkit 12.8 or newer)"; exit 1; }
    archs="${KEEPWARM_CUDA_ARCH:-$(gpu_architectures | tr '\n' ';' | sed 's/;$//')}"
    [[ -n "$archs" ]] || { log "no GPU found to build for: set KEEPWARM_CUDA_ARCH (e.g. 90)"; exit 1; }
    local nvcc_version key dest
    nvcc_version="$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    key="$(echo "$archs" | tr ';' '-')"
    dest="$cache_root/llama.cpp-$LLAMA_COMMIT-nlc$NLC_VERSION-linux-x64-cuda-sm$key-nvcc$nvcc_version"
    if [[ -f "$dest/.complete" ]]; then echo "$dest"; return; fi
    local llama_dir cuda_archs=""
    llama_dir="$("$here/fetch-llama.sh")"
    for a in ${archs//;/ }; do cuda_archs+="${cuda_archs:+;}$a-real"; done
    # Loadable beside the prebuilt libraries: it needs libggml-base.so by that name (no versioned soname), and
    # nothing the prebuilt does not (NCCL, for several GPUs, is not in the CUDA runtime a user installs).
    log "compiling libggml-cuda.so for $cuda_archs with nvcc $nvcc_version (minutes)"
    cmake -S "$llama_dir/source" -B "$dest.build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$cuda_archs" -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF \
        -DGGML_CUDA_NCCL=OFF -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON -DCMAKE_BUILD_RPATH='$ORIGIN' \
        -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >&2
    cmake --build "$dest.build" --target ggml-cuda -j"${JOBS:-$(nproc)}" >&2
    rm -rf "$dest.partial"
    mkdir -p "$dest.partial"
    cp "$(find "$dest.build" -name libggml-cuda.so -type f | head -1)" "$dest.partial/"
    touch "$dest.partial/.complete"
    rm -rf "$dest"
    mv "$dest.partial" "$dest"
    log "cached in $dest"
    echo "$dest"
}

case "$mode" in
    prebuilt) fetch_prebuilt ;;
    source) build_from_source ;;
    *) log "KEEPWARM_CUDA_BUILD=$mode: expected prebuilt or source"; exit 2 ;;
esac
