#!/usr/bin/env bash
# Builds llama.cpp's llama-bench from the pinned source tree against the PREBUILT libraries keepwarm links
# (libllama, libggml, libggml-base, libllama-common and the per-CPU libggml-cpu-* variants), so the benchmark
# runs exactly the same llama.cpp/ggml code as keepwarm. Prints the path of the binary on stdout.
#
# Layout (outside any build tree, keyed like the llama.cpp cache entry itself: commit + release):
#   <llama cache>/lib/llama-bench     the real binary, rpath $ORIGIN. It must live in lib/: llama-bench calls
#                                     ggml_backend_load_all(), which scans the directory of /proc/self/exe
#                                     (symlinks resolved) and the cwd for libggml-cpu-*.so and picks the
#                                     variant with the best score for this CPU.
#   <llama cache>/tools/llama-bench   symlink to it: the stable path this script prints.
#
# Idempotent: a binary whose stamp (source hash + flags + compiler) matches is reused without compiling.
# Environment: CXX (default g++), LLAMA_DIR (default: output of scripts/fetch-llama.sh).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
log() { echo "build-llama-bench: $*" >&2; }

llama_dir="${LLAMA_DIR:-$("$repo/scripts/fetch-llama.sh")}"
src="$llama_dir/source"
lib="$llama_dir/lib"
bench_src="$src/tools/llama-bench"
[[ -f "$bench_src/llama-bench.cpp" ]] || { log "no $bench_src/llama-bench.cpp"; exit 1; }
[[ -f "$lib/libllama-common.so" ]] || { log "no prebuilt libraries in $lib"; exit 1; }

cxx="${CXX:-g++}"
# The timed work all runs inside the prebuilt shared libraries, so the tool's own optimisation level hardly matters.
# -DNDEBUG: as in a release build (otherwise llama-bench prints "warning: asserts enabled").
cxxflags=(-O2 -DNDEBUG -std=c++17 -pthread -DLLAMA_SHARED -DGGML_SHARED -DGGML_BACKEND_SHARED)
includes=(-I"$src/include" -I"$src/ggml/include" -I"$src/common" -I"$src/vendor" -I"$bench_src")
# libllama-common.so already exports everything llama-bench.cpp uses from common/ (arg, common, download,
# fit, log, and build-info's llama_build_number/llama_commit), so nothing from common/ is compiled here.
libs=("$lib/libllama-common.so" "$lib/libllama.v0.4.0.so" "$lib/libggml.v0.4.0.so" "$lib/libggml-base.so")

out="$lib/llama-bench"
link="$llama_dir/tools/llama-bench"
stamp_file="$lib/llama-bench.stamp"
stamp="$( { cat "$bench_src/llama-bench.cpp" "$bench_src/main.cpp"; echo "${cxxflags[*]}"; "$cxx" --version | head -1; echo v1; } \
          | sha256sum | cut -c1-16)"

if [[ -x "$out" && -L "$link" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
    echo "$link"
    exit 0
fi

log "compiling $bench_src/llama-bench.cpp against the prebuilt libraries in $lib"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
"$cxx" "${cxxflags[@]}" "${includes[@]}" "$bench_src/llama-bench.cpp" "$bench_src/main.cpp" -o "$tmp" \
    "${libs[@]}" -Wl,-rpath,'$ORIGIN' -Wl,--enable-new-dtags

# Check that the libraries resolve to the cached ones and that a CPU backend variant gets loaded from lib/.
missing="$(ldd "$tmp" | grep 'not found' || true)"
[[ -z "$missing" ]] || { log "unresolved libraries:"; echo "$missing" >&2; exit 1; }
mv -f "$tmp" "$out"
trap - EXIT
mkdir -p "$llama_dir/tools"
ln -sfn ../lib/llama-bench "$link"
# ggml's loader logs "load_backend: loaded CPU backend from <path>" for the variant it picked (run from / so the
# cwd cannot supply one).
loaded="$(cd / && "$link" --list-devices 2>&1 | grep -m1 'loaded CPU backend from' || true)"
if [[ "$loaded" != *"from $lib/libggml-cpu-"* ]]; then
    log "llama-bench does not load a CPU backend variant from $lib (got: ${loaded:-nothing})"
    rm -f "$out" "$link"
    exit 1
fi
echo "$stamp" > "$stamp_file"
log "built $out; it ${loaded#load_backend: }"
echo "$link"
