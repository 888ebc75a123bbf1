#!/usr/bin/env bash
# Fails when a C++ file differs from what .clang-format asks for; `clang-format -i FILE` fixes it.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files 'src/*.cpp' 'src/*.h' 'tests/*.cpp' 'tests/*.h' 'fuzz/*.cpp' 'fuzz/*.h')
clang-format --dry-run --Werror "${files[@]}"
echo "format: ${#files[@]} files ok"
