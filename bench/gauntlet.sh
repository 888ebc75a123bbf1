#!/usr/bin/env bash
# The agentic cache gauntlet side by side: keepwarm (policy + prefix cache), keepwarm with both off, and the pinned
# llama-server (built against the same prebuilt llama.cpp libraries), launched one at a time by
# `keepwarm bench gauntlet --launch` on the same generated model, context, slots and threads. Runs the issue's
# "Results" parameters (16K system prompt, 3 agents, 2 slots, 6 turns, every killer on) on the dense and the hybrid
# bench model, and writes a JSON and an HTML report per model.
#
#   bench/gauntlet.sh [--preset bench-dense] [--hybrid-preset bench-hybrid] [--model FILE.gguf]
#                     [--hybrid-model FILE.gguf] [--no-hybrid] [--keepwarm PATH] [--llama-server PATH]
#                     [--out-dir DIR] [--regen] [any option of `keepwarm bench gauntlet`, e.g. --runs 2 --threads 2]
#
# Steps: build llama-server (bench/build-llama-server.sh, cached by llama.cpp commit); find keepwarm (default
# build/keepwarm, built in Release if missing); generate the models with `keepwarm mkmodel --preset P` into
# <keepwarm dir>/models/ (reused while newer than the keepwarm binary; --regen forces); run the gauntlet per model.
# Results: <keepwarm dir>/bench/gauntlet-<model>-<date>.json and .html unless --out-dir is given.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
log() { echo "gauntlet: $*" >&2; }

preset=bench-dense
hybrid_preset=bench-hybrid
model=""
hybrid_model=""
hybrid=1
keepwarm="${KEEPWARM_BIN:-}"
llama_server=""
out_dir=""
regen=0
threads=2
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --preset) preset="$2"; shift 2 ;;
        --hybrid-preset) hybrid_preset="$2"; shift 2 ;;
        --model) model="$2"; shift 2 ;;
        --hybrid-model) hybrid_model="$2"; shift 2 ;;
        --no-hybrid) hybrid=0; shift ;;
        --keepwarm) keepwarm="$2"; shift 2 ;;
        --llama-server) llama_server="$2"; shift 2 ;;
        --out-dir) out_dir="$2"; shift 2 ;;
        --regen) regen=1; shift ;;
        -t|--threads) threads="$2"; shift 2 ;;
        -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) extra+=("$1"); shift ;;
    esac
done

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
models=("$model")
if [[ "$hybrid" == 1 ]]; then
    [[ -n "$hybrid_model" ]] || hybrid_model="$(gen_model "$hybrid_preset")"
    models+=("$hybrid_model")
fi
out_dir="${out_dir:-$kw_dir/bench}"
mkdir -p "$out_dir"
commit="$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"

status=0
for m in "${models[@]}"; do
    [[ -s "$m" ]] || { log "no model at $m"; exit 1; }
    name="$(basename "$m" .gguf)"
    out="$out_dir/gauntlet-$name-$(date +%Y%m%d-%H%M%S)"
    log "$name at commit $commit: results in $out.{json,html}"
    # 2 slots of 32K (the bench models' trained context): a 16K system prompt, ~3K of tool definitions and six
    # turns of two tool rounds fit one conversation.
    "$keepwarm" bench gauntlet --launch --servers keepwarm,keepwarm-off,llama-server \
        --llama-server "$llama_server" -m "$m" -c 65536 --parallel 2 -t "$threads" \
        --system-tokens 16384 --agents 3 --turns 6 --killers all \
        --json "$out.json" --html "$out.html" "${extra[@]}" || status=1
done
exit "$status"
