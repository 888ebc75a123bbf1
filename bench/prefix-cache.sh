#!/usr/bin/env bash
# Prefix-cache benchmarks: keepwarm vs the pinned llama-server (built against the same prebuilt llama.cpp libraries),
# same generated model, context size, slots and threads, one server at a time. Prints tables; writes JSON + Markdown.
#
#   bench/prefix-cache.sh [--preset bench-dense] [--model FILE.gguf] [--hybrid-preset bench-hybrid]
#                         [--hybrid-model FILE.gguf] [--keepwarm PATH] [--llama-server PATH] [--out FILE.json]
#                         [--regen] [any option of bench/prefix-cache.mjs, e.g. --only a,e --sizes 2048,4096
#                          --threads 2 --keepwarm-args "--cache-ram 8GiB"]
#
# Steps: build llama-server (bench/build-llama-server.sh, cached by llama.cpp commit); find keepwarm (default
# build/keepwarm, built in Release if missing); generate the models with `keepwarm mkmodel --preset P` into
# <keepwarm dir>/models/ (reused while newer than the keepwarm binary; --regen forces; the hybrid one only when
# benchmark d runs); then bench/prefix-cache.mjs (Node 20, no packages) runs the benchmarks.
# Results: <keepwarm dir>/bench/prefix-cache-<model>-<date>.json and .md unless --out is given.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
log() { echo "prefix-cache: $*" >&2; }

preset=bench-dense
hybrid_preset=bench-hybrid
model=""
hybrid_model=""
keepwarm="${KEEPWARM_BIN:-}"
llama_server=""
out=""
regen=0
only="a,b,c,d,e"
extra=()
quote() { if [[ "$1" =~ ^[A-Za-z0-9_@%+=:,./~-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi; }
command_line="bench/prefix-cache.sh"
for a in "$@"; do command_line+=" $(quote "$a")"; done
while [[ $# -gt 0 ]]; do
    case "$1" in
        --preset) preset="$2"; shift 2 ;;
        --model) model="$2"; shift 2 ;;
        --hybrid-preset) hybrid_preset="$2"; shift 2 ;;
        --hybrid-model) hybrid_model="$2"; shift 2 ;;
        --keepwarm) keepwarm="$2"; shift 2 ;;
        --llama-server) llama_server="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --regen) regen=1; shift ;;
        --only) only="$2"; extra+=("$1" "$2"); shift 2 ;;
        -h|--help)
            sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            echo; node "$here/prefix-cache.mjs" --help
            exit 0 ;;
        --) shift; extra+=("$@"); break ;;
        *) extra+=("$1"); shift ;;
    esac
done

command -v node >/dev/null || { log "node (20 or later) is required"; exit 1; }
node_major="$(node -p 'process.versions.node.split(".")[0]')"
[[ "$node_major" -ge 20 ]] || { log "node 20 or later is required (found $(node --version))"; exit 1; }

if [[ -z "$llama_server" ]]; then
    llama_server="$("$here/build-llama-server.sh")"
fi
[[ -x "$llama_server" ]] || { log "no llama-server binary at $llama_server"; exit 1; }

if [[ -z "$keepwarm" ]]; then
    keepwarm="$repo/build/keepwarm"
    if [[ ! -x "$keepwarm" ]]; then
        log "building keepwarm (Release) in $repo/build"
        cmake -S "$repo" -B "$repo/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
        cmake --build "$repo/build" -j"$(nproc)" --target keepwarm >&2
    fi
fi
[[ -x "$keepwarm" ]] || { log "no keepwarm binary at $keepwarm"; exit 1; }
keepwarm="$(cd "$(dirname "$keepwarm")" && pwd)/$(basename "$keepwarm")"
kw_dir="$(dirname "$keepwarm")"

gen_model() { # preset -> path
    local m="$kw_dir/models/$1.gguf"
    if [[ "$regen" == 1 || ! -s "$m" || "$keepwarm" -nt "$m" ]]; then
        mkdir -p "$kw_dir/models"
        log "generating $m"
        "$keepwarm" mkmodel --preset "$1" -o "$m" >&2
    fi
    echo "$m"
}
[[ -n "$model" ]] || model="$(gen_model "$preset")"
[[ -s "$model" ]] || { log "no model at $model"; exit 1; }
args=(--keepwarm "$keepwarm" --llama-server "$llama_server" --model "$model")
if [[ ",$only," == *",d,"* ]]; then
    [[ -n "$hybrid_model" ]] || hybrid_model="$(gen_model "$hybrid_preset")"
    [[ -s "$hybrid_model" ]] || { log "no hybrid model at $hybrid_model"; exit 1; }
    args+=(--hybrid-model "$hybrid_model")
fi

if [[ -z "$out" ]]; then
    out="$kw_dir/bench/prefix-cache-$(basename "$model" .gguf)-$(date +%Y%m%d-%H%M%S).json"
fi

PREFIX_CACHE_COMMAND="$command_line" exec node "$here/prefix-cache.mjs" "${args[@]}" --out "$out" "${extra[@]}"
