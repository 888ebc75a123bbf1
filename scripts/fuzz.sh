#!/usr/bin/env bash
# Runs keepwarm's libFuzzer targets (fuzz/) under ASan and UBSan, built with clang in build-fuzz/.
#   scripts/fuzz.sh TARGET|all [EXECUTIONS]   fuzz each target for EXECUTIONS inputs (default 10 million), starting
#                                             from its corpus in fuzz/corpus/TARGET; new inputs go to
#                                             build-fuzz/corpus/TARGET, crashes to build-fuzz/crashes/TARGET/
#   scripts/fuzz.sh --short [SECONDS]         every target for SECONDS (default 3) after replaying its whole corpus:
#                                             the test suite's run. A target listed in fuzz/known-crashes is run
#                                             and reported, but does not fail it.
#   scripts/fuzz.sh --replay [TARGET|all]     runs the saved reproducers in fuzz/crashes/TARGET once each,
#                                             strict (a non-crash finding fails too)
# Targets: openai-request anthropic-request ollama-request openai-stream anthropic-stream ollama-stream policy-file
# proxy-config disk-entry prompt-index restore-plan. KEEPWARM_FUZZ_STRICT=1 also stops at a broken contract that is not a crash
# (an exception the route would answer with a 500; see fuzz/fuzz-support.h). An input over 10 s or 4 GiB is a crash.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(openai-request anthropic-request ollama-request openai-stream anthropic-stream ollama-stream policy-file
    proxy-config disk-entry prompt-index restore-plan kv-event-message)
build=build-fuzz
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

build_targets() {
    # ccache, where installed, comes from CMakeLists.txt.
    CC=clang CXX=clang++ cmake -S . -B "$build" -DKEEPWARM_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$build" -j"$(nproc)" >/dev/null
}

known_crash() {
    [[ -f fuzz/known-crashes ]] && grep -qE "^$1( |$)" fuzz/known-crashes
}

# Replays the corpus, then fuzzes for $2 seconds with a fixed seed; prints one line per target.
short_run() {
    local t=$1 seconds=$2 log
    log="$build/logs/$t.log"
    # libFuzzer adds what it finds to its first corpus folder: a scratch one, emptied so every run is the same.
    rm -rf "$build/corpus-short/$t"
    mkdir -p "$build/logs" "$build/crashes/$t" "$build/corpus-short/$t"
    if "$build/fuzz/fuzz-$t" -seed=1 -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$build/crashes/$t/" "$build/corpus-short/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
        echo "fuzz: $t: $(awk '/stat::number_of_executed_units/ {print $2}' "$log") inputs, no crash"
        return 0
    fi
    echo "fuzz: $t: CRASH (log $log, input in $build/crashes/$t/):" >&2
    grep -m1 -A6 -E "^==[0-9]+==ERROR|runtime error|deadly signal|timeout after|out-of-memory" "$log" >&2 || tail -20 "$log" >&2
    if known_crash "$t"; then
        echo "fuzz: $t is listed in fuzz/known-crashes: not failing the suite" >&2
        return 0
    fi
    return 1
}

mode=${1:-}
case "$mode" in
--short)
    build_targets
    failed=0
    for t in "${targets[@]}"; do short_run "$t" "${2:-3}" || failed=1; done
    exit "$failed"
    ;;
--replay)
    build_targets
    selected=("${targets[@]}")
    [[ -n "${2:-}" && "${2:-}" != all ]] && selected=("$2")
    for t in "${selected[@]}"; do
        for f in fuzz/crashes/"$t"/*; do
            [[ -f "$f" ]] || continue
            if KEEPWARM_FUZZ_STRICT=1 "$build/fuzz/fuzz-$t" -runs=1 "$f" >"$build/replay.log" 2>&1; then
                echo "fuzz: $t: $f: fixed"
            else
                echo "fuzz: $t: $f: still fails: $(grep -m1 -E 'finding|runtime error|ERROR' "$build/replay.log")"
            fi
        done
    done
    ;;
"" | -h | --help)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
*)
    selected=("${targets[@]}")
    [[ "$mode" != all ]] && selected=("$mode")
    for t in "${selected[@]}"; do
        [[ " ${targets[*]} " == *" $t "* ]] || { echo "fuzz: unknown target $t" >&2; exit 2; }
    done
    build_targets
    runs=${2:-10000000}
    for t in "${selected[@]}"; do
        mkdir -p "$build/corpus/$t" "$build/crashes/$t"
        start=$(date +%s)
        "$build/fuzz/fuzz-$t" -runs="$runs" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
            -artifact_prefix="$build/crashes/$t/" "$build/corpus/$t" "fuzz/corpus/$t" \
            2>&1 | tee "$build/fuzz-$t.log" | grep -E "stat::|ERROR|runtime error|deadly|keepwarm fuzz finding" || true
        # libFuzzer also saves inputs that took over 10 s as slow-unit-*: reported apart, they are not crashes (on a
        # loaded machine a starved process makes them; replay one with the target binary to time it).
        echo "fuzz: $t: $runs inputs in $(($(date +%s) - start)) s;" \
            "crashes: $(find "$build/crashes/$t" -type f ! -name 'slow-unit-*' | wc -l);" \
            "slow inputs: $(find "$build/crashes/$t" -type f -name 'slow-unit-*' | wc -l)"
    done
    ;;
esac
