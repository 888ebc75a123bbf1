#!/usr/bin/env bash
# keepwarm on an NVIDIA GPU, in one run: the build, the tests that touch the KV cache on the GPU, and the numbers
# side by side with the pinned llama-server on the same libraries and model. Writes gpu-check.json (and each
# step's log) to --out and prints a table. Sized to finish within 8 minutes on one H100/H200-class GPU.
#
#   bench/gpu-check.sh [--out DIR] [--budget-s 480]
#       on a GPU machine with this checkout: installs (scripts/install-deps.sh), builds with the CUDA backend
#       (KEEPWARM_GPU=cuda: scripts/fetch-llama-cuda.sh, a source build when nvcc is there and the prebuilt has no
#       machine code for this GPU), builds llama-server (bench/build-llama-server.sh) with the same backend.
#   bench/gpu-check.sh --make-bundle DIR
#       on a build machine: packs the built binaries (build/), llama-server, the tokenizers and templates that
#       `keepwarm mkmodel` needs, the CUDA backend (KEEPWARM_CUDA_LIB, else scripts/fetch-llama-cuda.sh with
#       KEEPWARM_GPU=cuda) and, where this machine has them, Node.js and the openai package for the e2e step, into
#       DIR/keepwarm-bundle.tar.xz, for a GPU machine that cannot install or build;
#   bench/gpu-check.sh --bundle DIR [--out DIR]
#       on that GPU machine: runs the checks with the bundle's binaries.
#
# Steps, each with its own time limit, results written as they come (a step that fails or runs out of time is
# recorded as such and the next one runs):
#   1. the start-up line of `keepwarm serve` names the GPU and 37/37 layers (or the check stops: nothing below
#      would measure a GPU);
#   2. unit tests that run a model (prefix cache, engine, local generation, runtime) on the GPU;
#   3. the end-to-end prefix-cache tests, where Node.js and tests/e2e/node_modules are there;
#   4. cold and warm-turn TTFT at 8K/16K/32K/44K tokens (bench/gpu-ttft.py), keepwarm vs llama-server, on the
#      bench-dense and bench-hybrid presets and an 8B-class shape (qwen3: 36 layers, width 4096, 32/8 heads,
#      ff 12288, q4_0: 4.4 GiB);
#   5. `keepwarm bench depth` on the 8B shape;
#   6. the gauntlet (`keepwarm bench gauntlet --launch`, keepwarm vs llama-server) on bench-dense, shortened;
#   7. a mixture-of-experts model whose experts are kept in host memory for some blocks (--n-cpu-moe 0, half, all;
#      qwen3moe in Qwen3-30B-A3B's block shape, 16 of its 48 blocks, q4_0: 5.4 GiB), keepwarm vs llama-server,
#      against what `keepwarm bench experts` predicts for an expert cache in the same GPU memory (bench/gpu-moe.py);
#   8. speculative decoding: `keepwarm bench spec` replays recorded agent trajectories (../shared/data/agent-traces,
#      or $KEEPWARM_TRACES) through the engine with drafting off and on, on bench-dense and the 8B shape;
#   9. the other model families (issue 34) at bench-dense's attention shape: cold and warm TTFT as in step 4 for MoE
#      (qwen3moe), hybrid MoE (qwen35moe), sliding-window (gemma3) and gpt-oss models (gpt-oss with a ChatML
#      template on both servers: llama-server's chat route answers 500 when a random model's output is not valid
#      harmony), then the gauntlet of step 6 on keepwarm for every family but dense (step 6's), gpt-oss with its
#      own harmony template.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
log() { echo "gpu-check: $*" >&2; }

out="$repo/gpu-check"
bundle=""
make_bundle=""
budget=480
allow_cpu=0
quick=0
steps=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --bundle) bundle="$2"; shift 2 ;;
        --make-bundle) make_bundle="$2"; shift 2 ;;
        --budget-s) budget="$2"; shift 2 ;;
        --allow-cpu) allow_cpu=1; shift ;;  # try the script itself on a machine without a GPU
        --quick) quick=1; shift ;;          # small sizes and models: the script's own trial run on a CPU
        --steps) steps="$2"; shift 2 ;;     # only these steps (comma-separated names, as in gpu-check.json)
        -h|--help) sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) log "unknown argument $1"; exit 2 ;;
    esac
done

unit_tests="test-llama-runtime test-prompt-cache test-engine test-local-generation test-depth-bench"
vocabs=(qwen2 qwen35 llama-bpe)

if [[ -n "$make_bundle" ]]; then
    set -e
    llama_dir="$("$repo/scripts/fetch-llama.sh")"
    cuda_lib="${KEEPWARM_CUDA_LIB:-}"
    [[ -n "$cuda_lib" ]] || cuda_lib="$(KEEPWARM_GPU=cuda "$repo/scripts/fetch-llama-cuda.sh")/libggml-cuda.so"
    server="$("$here/build-llama-server.sh")"
    stage="$(mktemp -d)"
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/bin/lib" "$stage/bin/tests" "$stage/llama-source/models/templates" "$stage/llama-server"
    cp "$repo/build/keepwarm" "$stage/bin/"
    cp "$repo"/build/lib/libggml-cpu-*.so "$repo"/build/lib/libggml-base.so "$repo"/build/lib/libllama-common.so \
        "$repo"/build/lib/libllama.v0.4.0.so "$repo"/build/lib/libggml.v0.4.0.so "$stage/bin/lib/"
    for t in $unit_tests; do cp "$repo/build/tests/$t" "$stage/bin/tests/"; done
    cp "$(readlink -f "$server")" "$stage/llama-server/llama-server"
    # The Debian libraries keepwarm links (xxhash, re2, toml++): the GPU machine may have other versions or none.
    ldd "$repo/build/keepwarm" "$stage"/bin/tests/* | awk '$3 ~ /^\/(usr\/)?lib\// {print $3}' | sort -u |
        grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so' | xargs -r cp -L -t "$stage/bin/lib/"
    for v in "${vocabs[@]}"; do cp "$llama_dir/source/models/ggml-vocab-$v.gguf" "$stage/llama-source/models/"; done
    # The end-to-end prefix-cache tests need Node.js and the openai package (no dependencies of its own): both go
    # along where this machine has them, for a GPU machine without Node.js (24 MB compressed).
    if command -v node >/dev/null && [[ -d "$repo/tests/e2e/node_modules/openai" ]]; then
        mkdir -p "$stage/node/bin" "$stage/node/node_modules"
        cp -L "$(command -v node)" "$stage/node/bin/"
        cp -r "$repo/tests/e2e/node_modules/openai" "$stage/node/node_modules/"
    fi
    cp "$llama_dir"/source/models/templates/*.jinja "$stage/llama-source/models/templates/"
    # The commit the binaries were built from (the GPU machine's copy of the tree may say another).
    echo "$(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet HEAD -- src || echo +changes)" \
        >"$stage/commit"
    # In the archive, compressed with the rest: the device tool carries at most 64 MiB.
    cp "$cuda_lib" "$stage/bin/lib/libggml-cuda.so"
    mkdir -p "$make_bundle"
    rm -f "$make_bundle/libggml-cuda.so"
    tar -C "$stage" -cf - . | xz -T0 -9 >"$make_bundle/keepwarm-bundle.tar.xz"
    du -sh "$make_bundle"/* >&2
    exit 0
fi

mkdir -p "$out"
json="$out/gpu-check.json"
started=$(date +%s)
results=()  # JSON fragments "name": {...}
left() { echo $((budget - ($(date +%s) - started))); }
record() { # name json-object
    results+=("\"$1\": $2")
    { echo "{"; local i; for ((i = 0; i < ${#results[@]}; i++)); do
        echo "  ${results[$i]}$([[ $i -lt $((${#results[@]} - 1)) ]] && echo ,)"; done; echo "}"; } >"$json"
}
# step NAME SECONDS CMD...: runs with a limit (never past the budget), logs to $out/NAME.log, records status.
step() {
    local name="$1" limit="$2"; shift 2
    if [[ -n "$steps" && ",$steps," != *",$name,"* ]]; then record "$name" '{"status": "not asked for (--steps)"}'; return 0; fi
    local remaining; remaining=$(left)
    ((limit > remaining)) && limit=$remaining
    if ((limit < 10)); then log "$name: skipped, out of time"; record "$name" '{"status": "skipped: out of time"}'; return 1; fi
    log "$name (up to ${limit} s)"
    local t0 rc; t0=$(date +%s%N)
    # bash -c: a step may be one of the functions below (exported).
    timeout --kill-after=10 "$limit" bash -c '"$@"' step "$@" >"$out/$name.log" 2>&1; rc=$?
    local secs; secs=$(python3 -c "print(round(($(date +%s%N) - $t0) / 1e9, 1))")
    local status=passed
    ((rc == 124 || rc == 137)) && status="timed out"
    ((rc != 0 && rc != 124 && rc != 137)) && status="failed (exit $rc)"
    log "$name: $status in $secs s"
    record "$name" "{\"status\": \"$status\", \"seconds\": ${secs}}"
    return $rc
}

# --- binaries -----------------------------------------------------------------------------------------------
work="$(mktemp -d)"
if [[ -n "$bundle" ]]; then
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        "$bundle/keepwarm-bundle.tar.xz" "$work"  # no xz needed there
    # A libggml-cuda.so beside the archive (another build of it) replaces the archive's.
    [[ -f "$bundle/libggml-cuda.so" ]] && cp "$bundle/libggml-cuda.so" "$work/bin/lib/"
    cp "$work"/bin/lib/*.so "$work/llama-server/"
    keepwarm="$work/bin/keepwarm"
    tests_dir="$work/bin/tests"
    llama_server="$work/llama-server/llama-server"
    export KEEPWARM_LLAMA_SOURCE_DIR="$work/llama-source"
    if [[ -x "$work/node/bin/node" ]] && ! command -v node >/dev/null; then
        export PATH="$work/node/bin:$PATH"
        [[ -e "$repo/tests/e2e/node_modules" ]] || ln -s "$work/node/node_modules" "$repo/tests/e2e/node_modules"
    fi
    # The test binaries find their libraries through their run path (../lib from tests/, as in build/).
else
    (cd "$repo" && scripts/install-deps.sh) >"$out/install.log" 2>&1 || { log "install failed: $out/install.log"; exit 1; }
    KEEPWARM_GPU=cuda cmake -S "$repo" -B "$repo/build-gpu" -DCMAKE_BUILD_TYPE=Release -DKEEPWARM_GPU=cuda \
        >"$out/build.log" 2>&1 &&
        cmake --build "$repo/build-gpu" -j"$(nproc)" --target keepwarm $unit_tests >>"$out/build.log" 2>&1 ||
        { log "build failed: $out/build.log"; exit 1; }
    keepwarm="$repo/build-gpu/keepwarm"
    tests_dir="$repo/build-gpu/tests"
    llama_server="$(JOBS=$(nproc) "$here/build-llama-server.sh" 2>>"$out/build.log")"
    cp "$repo/build-gpu/lib/libggml-cuda.so" "$(dirname "$(readlink -f "$llama_server")")/"
fi
models="$work/models"
mkdir -p "$models"

{
    echo "date: $(date -u +%FT%TZ)"
    if [[ -n "$bundle" ]]; then
        echo "binaries: commit $(cat "$work/commit" 2>/dev/null || echo unknown) (bundle)"
    else
        echo "binaries: commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
} | tee "$out/machine.txt" >&2
record machine "$(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read().splitlines()))' "$out/machine.txt")"

# The 8B-class model takes a minute to generate: start it now, beside the tests.
big_layers=36
sizes=8192,16384,32768,45056
gauntlet_size=(--system-tokens 16384 --turns 3)
moe_layers=16
moe_experts=128
moe_shape=(--width 2048 --heads 32 --kv-heads 4 --head-dim 128 --experts-used 8 --expert-ff 768)
if ((quick)); then
    big_layers=1; sizes=1024,2048; gauntlet_size=(--system-tokens 1024 --turns 1)
    moe_layers=2; moe_experts=8
    moe_shape=(--width 256 --heads 4 --kv-heads 2 --head-dim 64 --experts-used 2 --expert-ff 128)
fi
gen8b() {
    "$keepwarm" mkmodel --arch qwen3 --layers $big_layers --width 4096 --heads 32 --kv-heads 8 --head-dim 128 --ff 12288 \
        --ctx 65536 --vocab qwen2 --template Qwen-Qwen3-0.6B --type q4_0 -o "$models/qwen3-8b-shape-q4_0.gguf"
}
gen8b_pid=""
if [[ -z "$steps" || ",$steps," == *",ttft-8b,"* || ",$steps," == *",depth-8b,"* || ",$steps," == *",spec-8b,"* ]]; then
    gen8b >"$out/mkmodel-8b.log" 2>&1 &
    gen8b_pid=$!
fi
moe_model="$models/qwen3moe-30b-a3b-shape-${moe_layers}l-q4_0.gguf"
genmoe_pid=""
if [[ -z "$steps" || ",$steps," == *",moe-offload,"* ]]; then
    "$keepwarm" mkmodel --arch qwen3moe --layers $moe_layers --experts $moe_experts "${moe_shape[@]}" --ctx 16384 --vocab qwen2 \
        --template Qwen-Qwen3-0.6B --type q4_0 -o "$moe_model" >"$out/mkmodel-moe.log" 2>&1 &
    genmoe_pid=$!
fi
# Trained context 64K: llama-server caps its context at the model's (the presets have 32K), keepwarm does not.
"$keepwarm" mkmodel --preset bench-dense --ctx 65536 -o "$models/bench-dense.gguf" >"$out/mkmodel.log" 2>&1
"$keepwarm" mkmodel --preset bench-hybrid --ctx 65536 -o "$models/bench-hybrid.gguf" >>"$out/mkmodel.log" 2>&1
# The other families in bench-dense's attention shape (12 layers, width 1024, 16 heads of 128, 8 KV heads).
family_shape=(--layers 12 --width 1024 --heads 16 --kv-heads 8 --head-dim 128 --ff 3072 --ctx 65536)
((quick)) && family_shape=(--ctx 65536)
for family in moe hybrid-moe swa gpt-oss; do
    "$keepwarm" mkmodel --preset "tiny-$family" "${family_shape[@]}" -o "$models/bench-$family.gguf" \
        >>"$out/mkmodel.log" 2>&1 || log "bench-$family was not generated: $out/mkmodel.log"
done

# keepwarm looks for the CUDA 13 runtime on the loader's path and in /usr/local/cuda/lib64. Where it is in neither
# (a Python environment's nvidia-* packages, say), put the folders that hold it on the path, and say so.
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.13' && [[ ! -e /usr/local/cuda/lib64/libcublas.so.13 ]]; then
    extra="$(find /opt /usr/local /usr/lib -name 'libcu*.so.13' \( -name 'libcudart.so.13' -o -name 'libcublas*.so.13' \) \
        -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)"
    [[ -n "$extra" ]] && export LD_LIBRARY_PATH="$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    log "CUDA runtime not in /usr/local/cuda/lib64; LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
fi

# --- 1. the GPU is used --------------------------------------------------------------------------------------
"$keepwarm" serve -m "$models/bench-dense.gguf" -c 4096 --port 0 --cache-disk 0 >"$out/serve-banner.log" 2>&1 &
serve_pid=$!
for _ in $(seq 1 100); do grep -q "listening on" "$out/serve-banner.log" && break; sleep 0.2; done
kill "$serve_pid" 2>/dev/null; wait "$serve_pid" 2>/dev/null
compute="$(sed -n 's/^  compute: //p' "$out/serve-banner.log")"
log "compute: $compute"
record compute "$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$compute")"
if [[ "$compute" != *"layers on the GPU"* && $allow_cpu -eq 0 ]]; then
    cat "$out/serve-banner.log" >&2
    log "keepwarm does not use a GPU here (see $out/serve-banner.log); stopping"
    exit 1
fi

ttft() { # model sizes [keepwarm-args tag both-servers-args]
    python3 "$here/gpu-ttft.py" --model "$1" --keepwarm "$keepwarm" --llama-server "$llama_server" --sizes "$2" \
        --keepwarm-args "${3:-}" --both-args "${5:-}" --work-dir "$out" \
        --json "$out/ttft-$(basename "$1" .gguf)${4:-}.json"
}

# keepwarm finds the CUDA runtime in /usr/local/cuda by itself (checked above); llama-server needs it on the path.
[[ -d /usr/local/cuda/lib64 ]] && export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# --- 2. unit tests on the GPU --------------------------------------------------------------------------------
unit() {
    local pids=() t rc=0
    for t in $unit_tests; do
        local filter='*'
        # Its other tests load stub libraries from the build tree it was built in.
        [[ $t == test-llama-runtime ]] && filter='DescribeCompute.*'
        "$tests_dir/$t" --gtest_brief=1 --gtest_filter="$filter" >"$out/unit-$t.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    for t in $unit_tests; do echo "$t: $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/unit-$t.log" | tr '\n' ' ')"; done
    return $rc
}
# The expert-cache simulation's trace, with a slot count per layer for each split (the same GPU memory as a cache),
# then both servers at each split.
moe() {
    local splits slots="" n
    splits="0,$((moe_layers / 2)),$moe_layers"
    for n in ${splits//,/ }; do
        local s=$(((moe_experts * (moe_layers - n) + moe_layers / 2) / moe_layers))
        ((s > 0)) && slots+="${slots:+,}$s"
    done
    "$keepwarm" bench experts -m "$moe_model" --gen 64 --slots "$slots" --json "$out/experts-moe.json" || return 1
    python3 "$here/gpu-moe.py" --model "$moe_model" --keepwarm "$keepwarm" --llama-server "$llama_server" \
        --experts-json "$out/experts-moe.json" --splits "$splits" --work-dir "$out" --json "$out/moe-offload.json"
}
export -f unit ttft moe
export out tests_dir unit_tests keepwarm llama_server here moe_model moe_layers moe_experts
step unit 150 unit
cat "$out/unit.log" >&2

# --- 3. end-to-end tests -------------------------------------------------------------------------------------
if [[ -n "$steps" && ",$steps," != *",e2e,"* ]]; then
    record e2e '{"status": "not asked for (--steps)"}'
elif command -v node >/dev/null && [[ -d "$repo/tests/e2e/node_modules" ]]; then
    KEEPWARM_BINARY="$keepwarm" step e2e 120 node --test "$repo/tests/e2e/prefix-cache.test.mjs"
else
    log "e2e: skipped (needs Node.js and tests/e2e/node_modules: scripts/install-deps.sh)"
    record e2e '{"status": "skipped: no Node.js or tests/e2e/node_modules on this machine"}'
fi

# --- 4. TTFT, side by side -----------------------------------------------------------------------------------
step ttft-bench-dense 60 ttft "$models/bench-dense.gguf" $sizes
step ttft-bench-hybrid 60 ttft "$models/bench-hybrid.gguf" $sizes
# The hybrid model checkpoints its recurrent state every --checkpoint-every tokens of a prompt (on a GPU, the batch
# size): what the checkpoints still cost a cold prefill shows against a run that keeps only the message starts'.
step ttft-bench-hybrid-few-checkpoints 60 ttft "$models/bench-hybrid.gguf" $sizes "--checkpoint-every 1048576" \
    -few-checkpoints
# What else a hybrid model's cold prefill pays on the GPU: the recurrent state is sized for every sequence keepwarm may
# hold (slots, parked conversations, scratch: 10 by default, llama-server's 1); without parked conversations it holds 2.
step ttft-bench-hybrid-no-parked 60 ttft "$models/bench-hybrid.gguf" $sizes \
    "--checkpoint-every 1048576 --cache-parked 0" -no-parked
[[ -z "$gen8b_pid" ]] || wait "$gen8b_pid" || log "the 8B-class model was not generated: $out/mkmodel-8b.log"
step ttft-8b 150 ttft "$models/qwen3-8b-shape-q4_0.gguf" $sizes

# --- 5. depth ------------------------------------------------------------------------------------------------
step depth-8b 60 "$keepwarm" bench depth -m "$models/qwen3-8b-shape-q4_0.gguf" --depths 0,8192,32768 --kv f16,q8_0 \
    -p 512 -n 64 --json "$out/depth-8b.json"

# --- 6. gauntlet ---------------------------------------------------------------------------------------------
step gauntlet-bench-dense 150 "$keepwarm" bench gauntlet --launch --servers keepwarm,llama-server \
    --llama-server "$llama_server" --policy "$repo/etc/keepwarm-policy.toml" -m "$models/bench-dense.gguf" \
    -c 65536 --parallel 2 "${gauntlet_size[@]}" --agents 3 --tool-rounds 1 --killers all \
    --work-dir "$work/gauntlet" --json "$out/gauntlet-bench-dense.json"

# --- 7. experts in host memory ------------------------------------------------------------------------------
[[ -z "$genmoe_pid" ]] || wait "$genmoe_pid" || log "the MoE model was not generated: $out/mkmodel-moe.log"
step moe-offload 180 moe

# --- 8. speculative decoding ---------------------------------------------------------------------------------
traces="${KEEPWARM_TRACES:-$repo/../shared/data/agent-traces/swe-agent-gemini3pro-400.jsonl.xz}"
replay_size=(--trajectories 2 --turns 8)
((quick)) && replay_size=(--trajectories 1 --turns 2)
if [[ -s "$traces" ]]; then
    step spec-bench-dense 90 "$keepwarm" bench spec -m "$models/bench-dense.gguf" --traces "$traces" "${replay_size[@]}" \
        --json "$out/spec-bench-dense.json"
    step spec-8b 150 "$keepwarm" bench spec -m "$models/qwen3-8b-shape-q4_0.gguf" --traces "$traces" "${replay_size[@]}" \
        --json "$out/spec-8b.json"
else
    log "spec: skipped (no recorded trajectories at $traces; set KEEPWARM_TRACES)"
    record spec-bench-dense '{"status": "skipped: no recorded trajectories"}'
fi

# --- 9. the other model families --------------------------------------------------------------------------
for family in moe hybrid-moe swa; do
    step "ttft-bench-$family" 60 ttft "$models/bench-$family.gguf" $sizes
done
chatml="${KEEPWARM_LLAMA_SOURCE_DIR:-$("$repo/scripts/fetch-llama.sh")/source}/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
step ttft-bench-gpt-oss 60 ttft "$models/bench-gpt-oss.gguf" $sizes "" "" "--chat-template-file $chatml"
for family in hybrid moe hybrid-moe swa gpt-oss; do
    step "gauntlet-bench-$family" 90 "$keepwarm" bench gauntlet --launch --servers keepwarm \
        --policy "$repo/etc/keepwarm-policy.toml" -m "$models/bench-$family.gguf" -c 65536 --parallel 2 \
        "${gauntlet_size[@]}" --agents 3 --tool-rounds 1 --killers all --work-dir "$work/gauntlet-$family" \
        --json "$out/gauntlet-bench-$family.json"
done

python3 "$here/gpu-check-report.py" "$out" | tee "$out/gpu-check.md"
log "done in $(($(date +%s) - started)) s; results in $out"
