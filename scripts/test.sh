#!/usr/bin/env bash
# Second command of the README: installs what is missing, builds if needed, and runs the whole test suite:
# the formatting, layer and link checks, unit tests and end-to-end tests (the real binary driven by the official npm clients and curl), then the unit
# tests again under AddressSanitizer and UndefinedBehaviorSanitizer, and a short run of every fuzz target (fuzz/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/check-format.sh
scripts/check-layers.sh
scripts/check-links.sh
jobs="$(nproc)"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -L unit -j"$jobs"
# The proxy's end-to-end tests run llama-server as one of its upstreams: built from the pinned source against the
# same prebuilt libraries, cached outside the build tree by llama.cpp commit (a no-op once built; on every core the
# first time, as nothing else runs then).
LLAMA_SERVER="$(JOBS="$jobs" bench/build-llama-server.sh)"
export LLAMA_SERVER
ctest --test-dir build --output-on-failure -L e2e --verbose

if [[ "${KEEPWARM_SKIP_SANITIZERS:-0}" != 1 ]]; then
    cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DKEEPWARM_SANITIZE=ON >/dev/null
    cmake --build build-sanitize -j"$jobs"
    # The sliding-window suite's full-size-cache runs (`..._swa_full`) take the dense models' code paths, which the
    # other tests cover here; they run in the Release pass above. Under the sanitizers they took 376 s of test time
    # (about 3 min on two cores).
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        ctest --test-dir build-sanitize --output-on-failure -L unit -E '_swa_full ' -j"$jobs"
    # Every fuzz target replays its corpus (fuzz/corpus) and fuzzes for 3 s under ASan+UBSan (build-fuzz, clang).
    scripts/fuzz.sh --short 3
fi
echo "keepwarm: all tests passed"
