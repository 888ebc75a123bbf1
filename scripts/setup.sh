#!/usr/bin/env bash
# First command of the README: installs everything keepwarm needs on Debian 12, builds it, and starts
# `keepwarm serve` on the generated demo model. Extra arguments go to `keepwarm serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target keepwarm
exec build/keepwarm serve "$@"
