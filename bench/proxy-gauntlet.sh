#!/usr/bin/env bash
# The gauntlet through `keepwarm proxy` in front of llama-server, against llama-server alone: two llama-server
# instances of the pinned build (bench/build-llama-server.sh) on the same model, context, slots and threads, one
# reached directly and one only through the proxy (running the same policy file as `keepwarm serve` would), and
# `keepwarm bench gauntlet` replaying the same workload against both, one after the other. What it shows: the prompt
# tokens llama-server computes when the proxy normalizes requests in front of it (billing nonces, request ids, pings,
# model names, num_ctx) vs when clients reach it directly.
#
#   bench/proxy-gauntlet.sh --model FILE.gguf [--keepwarm PATH] [--llama-server PATH] [--out-dir DIR] [-t THREADS]
#                           [any option of `keepwarm bench gauntlet`, e.g. --tool-rounds 1]
#
# The restart killer is left out: the bench restarts only servers it launched itself, and these are launched here.
# Results: DIR/proxy-gauntlet-<model>.{json,html}, the servers' and the proxy's logs beside them, and the proxy's
# GET /v1/cache at the end (DIR/proxy-cache.json).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
log() { echo "proxy-gauntlet: $*" >&2; }

model=""
keepwarm="$repo/build/keepwarm"
llama_server=""
out_dir="$PWD"
threads=2
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) model="$2"; shift 2 ;;
        --keepwarm) keepwarm="$2"; shift 2 ;;
        --llama-server) llama_server="$2"; shift 2 ;;
        --out-dir) out_dir="$2"; shift 2 ;;
        -t|--threads) threads="$2"; shift 2 ;;
        -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) extra+=("$1"); shift ;;
    esac
done
[[ -s "$model" ]] || { log "give --model FILE.gguf"; exit 1; }
[[ -x "$keepwarm" ]] || { log "no keepwarm binary at $keepwarm (build it first)"; exit 1; }
[[ -n "$llama_server" ]] || llama_server="$("$here/build-llama-server.sh")"
mkdir -p "$out_dir"
name="$(basename "$model" .gguf)"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
direct_port="$(free_port)"
behind_port="$(free_port)"
proxy_port="$(free_port)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

for port in "$direct_port" "$behind_port"; do
    "$llama_server" -m "$model" -c 65536 -np 2 -t "$threads" --host 127.0.0.1 --port "$port" \
        > "$out_dir/llama-server-$port.log" 2>&1 &
    pids+=($!)
done
"$keepwarm" proxy --upstream "http://127.0.0.1:$behind_port" --policy "$repo/etc/keepwarm-policy.toml" \
    --port "$proxy_port" > "$out_dir/proxy.log" 2>&1 &
pids+=($!)
for port in "$direct_port" "$behind_port" "$proxy_port"; do
    for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
    curl -sf "http://127.0.0.1:$port/health" > /dev/null || { log "nothing answers on port $port"; exit 1; }
done

commit="$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
log "$name at commit $commit: llama-server alone on $direct_port, through the proxy on $proxy_port"
"$keepwarm" bench gauntlet -m "$model" \
    --target "llama-server=http://127.0.0.1:$direct_port" --target "proxy+llama-server=http://127.0.0.1:$proxy_port" \
    --system-tokens 16384 --agents 3 --turns 6 --killers cch,request-id,ping,model,num-ctx,cancel,reasoning \
    --json "$out_dir/proxy-gauntlet-$name.json" --html "$out_dir/proxy-gauntlet-$name.html" "${extra[@]}"
curl -sf "http://127.0.0.1:$proxy_port/v1/cache" > "$out_dir/proxy-cache.json" || true
