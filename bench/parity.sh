#!/usr/bin/env bash
# Throughput parity: keepwarm vs the pinned llama-bench on the same prebuilt llama.cpp libraries, generated model,
# threads and KV cache type. Prints a table (test, llama-bench t/s, keepwarm t/s, ratio) and writes JSON + Markdown.
#
#   bench/parity.sh [--preset bench-dense] [--model FILE.gguf] [--threads N] [--kv f16,q8_0] [--reps 3]
#                   [--keepwarm PATH] [--out FILE.json] [--regen] [--spec-traffic] [-- extra args for bench/parity.py]
#
# --spec-traffic: speculative decoding on ordinary traffic instead (the random model's own answers, where drafts are
# almost never right): decode tokens/s of keepwarm with and without drafting and of the pinned llama-server
# (bench/build-llama-server.sh) with and without --spec-type ngram-mod, same prompts, and their ratios
# (-n tokens per answer, --spec-prompts N, --spec-kv TYPE after --).
#
# Steps: build llama-bench (bench/build-llama-bench.sh, cached by llama.cpp commit); find keepwarm (default
# build/keepwarm, built in Release if missing); generate the model with `keepwarm mkmodel --preset P` into
# <keepwarm dir>/models/ (reused while newer than the keepwarm binary; --regen forces); then bench/parity.py runs
# llama-bench -p 512 -n 128 and keepwarm serve's HTTP API side by side, alternating, for each KV type.
# Results: <keepwarm dir>/bench/parity-<preset>-<date>.json and .md unless --out is given.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
log() { echo "parity: $*" >&2; }

preset=bench-dense
model=""
keepwarm="${KEEPWARM_BIN:-}"
out=""
regen=0
spec_traffic=0
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --preset) preset="$2"; shift 2 ;;
        --model) model="$2"; shift 2 ;;
        --keepwarm) keepwarm="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --regen) regen=1; shift ;;
        --spec-traffic) spec_traffic=1; shift ;;
        --threads|--kv|--reps|-p|-n|--ctx|--batch|--ubatch) extra+=("$1" "$2"); shift 2 ;;
        --) shift; extra+=("$@"); break ;;
        -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) log "unknown option $1 (see --help)"; exit 2 ;;
    esac
done

command -v python3 >/dev/null || { log "python3 is required"; exit 1; }

if [[ "$spec_traffic" == 1 ]]; then
    llama_server="$("$here/build-llama-server.sh")"
else
    llama_bench="$("$here/build-llama-bench.sh")"
fi

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

if [[ -z "$model" ]]; then
    model="$kw_dir/models/$preset.gguf"
    if [[ "$regen" == 1 || ! -s "$model" || "$keepwarm" -nt "$model" ]]; then
        mkdir -p "$kw_dir/models"
        log "generating $model"
        "$keepwarm" mkmodel --preset "$preset" -o "$model" >&2
    fi
fi
[[ -s "$model" ]] || { log "no model at $model"; exit 1; }

if [[ -z "$out" ]]; then
    kind=parity
    [[ "$spec_traffic" == 1 ]] && kind=parity-spec
    out="$kw_dir/bench/$kind-$(basename "$model" .gguf)-$(date +%Y%m%d-%H%M%S).json"
fi

if [[ "$spec_traffic" == 1 ]]; then
    exec python3 "$here/parity.py" --spec-traffic --llama-server "$llama_server" --keepwarm "$keepwarm" \
        --model "$model" --out "$out" "${extra[@]}"
fi

exec python3 "$here/parity.py" --llama-bench "$llama_bench" --keepwarm "$keepwarm" --model "$model" --out "$out" \
    "${extra[@]}"
