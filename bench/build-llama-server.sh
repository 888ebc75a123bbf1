#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the pinned source tree against the PREBUILT libraries keepwarm links
# (libllama, libggml, libggml-base, libllama-common and the per-CPU libggml-cpu-* variants), so the comparison
# server runs exactly the same llama.cpp/ggml code as keepwarm. A comparison target only: keepwarm never runs or
# links it. Prints the path of the binary on stdout.
#
# Layout (outside any build tree, keyed like the llama.cpp cache entry itself: commit + release):
#   <llama cache>/lib/llama-server     the real binary, rpath $ORIGIN. It lives in lib/ because llama-server calls
#                                      ggml_backend_load_all(), which scans the directory of /proc/self/exe
#                                      (symlinks resolved) and the cwd for libggml-cpu-*.so.
#   <llama cache>/tools/llama-server   symlink to it: the stable path this script prints.
#   <llama cache>/build-llama-server/  objects (kept so that a changed flag recompiles only what it must).
#
# What is compiled here, and why (everything else comes from the prebuilt libraries):
#   - tools/server/*.cpp: the server itself (upstream targets server-context, llama-server-impl, llama-server).
#   - tools/mtmd/*.cpp (+ models/): llama-server links libmtmd for images/audio; the prebuilt bundle has no
#     libmtmd. Compiled in so the binary is the upstream one; a text-only request never enters it.
#   - vendor/cpp-httplib/httplib.cpp with upstream's compile definitions (listen backlog 512, TCP_NODELAY, ...).
#     libllama-common.so also exports httplib (it is linked into common), built with the same definitions; the
#     executable's own copy wins, as in upstream's shared-library build, which links cpp-httplib into the server.
#   - the web UI table (ui.cpp/ui.h): upstream generates it with tools/ui/embed.cpp from the built Svelte app
#     (npm build or a Hugging Face download). The pinned tree has no built app and these machines have no network,
#     so embed.cpp is run without an asset directory: the empty table upstream itself emits when no assets are
#     available (`/` then answers 404; the API is unaffected).
#   - vendor/hash (sha256/xxhash), only if libllama-common.so does not export it.
# Compile definitions follow the prebuilt libllama-common: LLAMA_SUBPROCESS on (it exports common_subproc with
# subprocess support, so subproc.h must see the same struct), no LLGUIDANCE, no OpenSSL.
#
# Idempotent: a binary whose stamp (source hash + flags + compiler) matches is reused without compiling.
# Environment: CXX (default g++), CC (default gcc), LLAMA_DIR (default: output of scripts/fetch-llama.sh),
# JOBS (parallel compiles, default 1: the build machine is shared).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
log() { echo "build-llama-server: $*" >&2; }

llama_dir="${LLAMA_DIR:-$("$repo/scripts/fetch-llama.sh")}"
src="$llama_dir/source"
lib="$llama_dir/lib"
server_src="$src/tools/server"
mtmd_src="$src/tools/mtmd"
[[ -f "$server_src/server.cpp" ]] || { log "no $server_src/server.cpp"; exit 1; }
[[ -f "$mtmd_src/mtmd.cpp" ]] || { log "no $mtmd_src/mtmd.cpp"; exit 1; }
[[ -f "$lib/libllama-common.so" ]] || { log "no prebuilt libraries in $lib"; exit 1; }

cxx="${CXX:-g++}"
cc="${CC:-gcc}"
jobs="${JOBS:-1}"
# The timed work all runs inside the prebuilt shared libraries; -O2 -DNDEBUG as in a release build.
common_flags=(-O2 -DNDEBUG -pthread -fPIC -DLLAMA_SHARED -DGGML_SHARED -DGGML_BACKEND_SHARED -DLLAMA_SUBPROCESS)
cxxflags=("${common_flags[@]}" -std=c++17)
work="$llama_dir/build-llama-server"
gen="$work/gen"
obj="$work/obj"
includes=(-I"$src/include" -I"$src/ggml/include" -I"$src/common" -I"$src/vendor" -I"$server_src" -I"$mtmd_src"
          -I"$src" -I"$gen")
httplib_defs=(-DCPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH=1048576 -DCPPHTTPLIB_LISTEN_BACKLOG=512
              -DCPPHTTPLIB_REQUEST_URI_MAX_LENGTH=32768 -DCPPHTTPLIB_TCP_NODELAY=1)
libs=("$lib/libllama-common.so" "$lib/libllama.v0.4.0.so" "$lib/libggml.v0.4.0.so" "$lib/libggml-base.so")

# Sources: the server targets' lists and mtmd's list, read from the CMakeLists so they follow the tree.
cmake_sources() { # file target-regex dir
    sed -n "/^add_$2/,/)/p" "$1" | grep -oE '[A-Za-z0-9_/.-]+\.cpp' | sed "s|^|$3/|"
}
mapfile -t server_files < <(cmake_sources "$server_src/CMakeLists.txt" 'library(\${TARGET} STATIC' "$server_src";
                             cmake_sources "$server_src/CMakeLists.txt" 'library(\${TARGET}$' "$server_src";
                             echo "$server_src/main.cpp")
mapfile -t mtmd_files < <(cmake_sources "$mtmd_src/CMakeLists.txt" 'library(mtmd' "$mtmd_src")
[[ ${#server_files[@]} -ge 10 && ${#mtmd_files[@]} -ge 6 ]] || {
    log "could not read the source lists from the CMakeLists (server: ${#server_files[@]}, mtmd: ${#mtmd_files[@]})"
    exit 1
}
hash_lib=0
if ! nm -D --defined-only "$lib/libllama-common.so" | grep '_Z15hash_sha256_hex' >/dev/null; then hash_lib=1; fi
hash_files=()
[[ "$hash_lib" == 1 ]] && hash_files=("$src/vendor/hash/hash.cpp" "$src/vendor/hash/xxhash/xxhash.c"
                                      "$src/vendor/hash/sha1/sha1.c" "$src/vendor/hash/sha256/sha256.c")
all_files=("${server_files[@]}" "${mtmd_files[@]}" "$src/vendor/cpp-httplib/httplib.cpp" "${hash_files[@]}"
           "$src/tools/ui/embed.cpp")

out="$lib/llama-server"
link="$llama_dir/tools/llama-server"
stamp_file="$lib/llama-server.stamp"
stamp="$( { cat "${all_files[@]}" "$server_src"/*.h "$mtmd_src"/*.h; echo "${cxxflags[*]} ${httplib_defs[*]}";
            "$cxx" --version | head -1; echo v1; } | sha256sum | cut -c1-16)"

if [[ -x "$out" && -L "$link" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
    echo "$link"
    exit 0
fi

mkdir -p "$gen" "$obj"
flags_stamp="$( { echo "${cxxflags[*]} ${httplib_defs[*]}"; "$cxx" --version | head -1; } | sha256sum | cut -c1-16)"
if [[ ! -f "$obj/flags" || "$(cat "$obj/flags")" != "$flags_stamp" ]]; then
    rm -f "$obj"/*.o
    echo "$flags_stamp" > "$obj/flags"
fi

# The empty UI table (see above), from upstream's own generator.
if [[ ! -f "$gen/ui.cpp" || ! -f "$gen/ui.h" || "$src/tools/ui/embed.cpp" -nt "$gen/ui.cpp" ]]; then
    log "generating the (empty) web UI table with tools/ui/embed.cpp"
    "$cxx" -O1 -std=c++17 "$src/tools/ui/embed.cpp" -o "$work/llama-ui-embed"
    "$work/llama-ui-embed" "$gen/ui.cpp" "$gen/ui.h" >&2
fi

# Object name: path under the source tree with / -> _. Recompiled when the source or any header of its
# directory is newer than the object (headers from common/ and include/ only change with the cache entry).
objname() { local rel="${1#"$src"/}"; rel="${rel#"$work"/}"; echo "$obj/${rel//\//_}.o"; }
compile_one() { # source extra-flags...
    local s="$1"; shift
    local o
    o="$(objname "$s")"
    local newest
    newest="$(ls -t "$s" "$(dirname "$s")"/*.h 2>/dev/null | head -1)"
    if [[ -f "$o" && "$o" -nt "$newest" ]]; then return 0; fi
    echo "$s|$o|$*"
}
todo=()
while IFS= read -r line; do [[ -n "$line" ]] && todo+=("$line"); done < <(
    for s in "${server_files[@]}"; do compile_one "$s"; done
    for s in "${mtmd_files[@]}"; do compile_one "$s" -DLLAMA_BUILD -DMTMD_VIDEO -Wno-cast-qual; done
    compile_one "$src/vendor/cpp-httplib/httplib.cpp" -w "${httplib_defs[@]}"
    for s in "${hash_files[@]}"; do compile_one "$s" -w -I"$src/vendor/hash"; done
    compile_one "$gen/ui.cpp"
)
objects=()
for s in "${server_files[@]}" "${mtmd_files[@]}" "$src/vendor/cpp-httplib/httplib.cpp" "${hash_files[@]}" "$gen/ui.cpp"; do
    objects+=("$(objname "$s")")
done

compile() { # "src|obj|flags"
    local s o f
    IFS='|' read -r s o f <<<"$1"
    local -a extra=()
    read -r -a extra <<<"$f"
    case "$s" in
        */sha1/sha1.c) "$cxx" "${cxxflags[@]}" -x c++ "${extra[@]}" "${includes[@]}" -c "$s" -o "$o.tmp" ;;
        *.c) "$cc" "${common_flags[@]}" "${extra[@]}" "${includes[@]}" -c "$s" -o "$o.tmp" ;;
        *) "$cxx" "${cxxflags[@]}" "${extra[@]}" "${includes[@]}" -c "$s" -o "$o.tmp" ;;
    esac
    mv -f "$o.tmp" "$o"
}
if [[ ${#todo[@]} -gt 0 ]]; then
    log "compiling ${#todo[@]} files (server, mtmd, cpp-httplib${hash_files:+, vendor hash}) with $jobs job(s)," \
        "against the prebuilt libraries in $lib"
    n=0
    pids=()
    for t in "${todo[@]}"; do
        n=$((n + 1))
        log "  [$n/${#todo[@]}] ${t%%|*}"
        if [[ "$jobs" -le 1 ]]; then
            compile "$t"
        else
            compile "$t" &
            pids+=($!)
            while [[ "$(jobs -rp | wc -l)" -ge "$jobs" ]]; do sleep 0.2; done
        fi
    done
    for p in "${pids[@]}"; do wait "$p" || { log "a compile failed (see above)"; exit 1; }; done
fi

log "linking"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
"$cxx" -pthread "${objects[@]}" -o "$tmp" "${libs[@]}" -Wl,-rpath,'$ORIGIN' -Wl,--enable-new-dtags

# Check that the libraries resolve to the cached ones and that a CPU backend variant gets loaded from lib/.
missing="$(ldd "$tmp" | grep 'not found' || true)"
[[ -z "$missing" ]] || { log "unresolved libraries:"; echo "$missing" >&2; exit 1; }
mv -f "$tmp" "$out"
trap - EXIT
mkdir -p "$llama_dir/tools"
ln -sfn ../lib/llama-server "$link"
# ggml's loader logs "load_backend: loaded CPU backend from <path>" for the variant it picked, at debug level in
# llama-server (hence -lv 4, before --list-devices, which exits), run from / so the cwd cannot supply one.
loaded="$(cd / && "$link" -lv 4 --list-devices 2>&1 | grep -m1 'loaded CPU backend from' || true)"
if [[ "$loaded" != *"from $lib/libggml-cpu-"* ]]; then
    log "llama-server does not load a CPU backend variant from $lib (got: ${loaded:-nothing})"
    rm -f "$out" "$link"
    exit 1
fi
echo "$stamp" > "$stamp_file"
log "built $out; it ${loaded#*load_backend: }"
echo "$link"
