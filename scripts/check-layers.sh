#!/usr/bin/env bash
# Checks that src/ keeps its layers: a folder includes only its own headers and those of the folders it is allowed
# below (the table), so no lower layer includes a higher one, and only the frontends read a dialect (api/) header.
# docs/architecture.md draws the same table. Prints each offending include; exits 1 if there is one.
#   scripts/check-layers.sh
set -euo pipefail
cd "$(dirname "$0")/../src"

# folder -> the folders its files may include, lowest layers first.
declare -A allowed=(
    [base]=""
    [json]="base"
    [config]="base"
    [http]="base"
    [cache]="base"
    [engine]="base cache"
    [model]="base engine cache"
    [chat]="base json engine cache"
    [policy]="base json config chat engine cache"
    [api]="base json chat"
    [routes]="base json config http cache engine model chat policy api"
    [local]="base json config http cache engine model chat policy api routes"
    [proxy]="base json config http cache engine model chat policy api routes"
    [bench]="base json config http cache engine model chat policy api"
    [commands]="base json config http cache engine model chat policy api routes local proxy bench"
)

status=0
for dir in */; do
    dir=${dir%/}
    if [[ ! -v allowed[$dir] ]]; then
        echo "check-layers: src/$dir/ is not in the layer table of scripts/check-layers.sh" >&2
        status=1
        continue
    fi
    while IFS=: read -r file line include; do
        target=$(sed -E 's/.*#include "([a-z0-9_-]+)\/.*/\1/' <<<"$include")
        [[ "$target" == "$dir" || " ${allowed[$dir]} " == *" $target "* ]] && continue
        [[ -d "$target" ]] || continue  # not one of ours (e.g. a llama.cpp header in a folder)
        echo "check-layers: src/$file:$line: $dir/ may not include $target/ (${include#*#include })" >&2
        status=1
    done < <(grep -nE '^#include "[a-z0-9_-]+/' -r "$dir" --include='*.h' --include='*.cpp' || true)
done
[[ $status == 0 ]] && echo "check-layers: every include in src/ follows the layer table"
exit $status
