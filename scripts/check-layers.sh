#!/usr/bin/env bash
# Checks that src/ keeps its layers: a folder includes only its own headers and those of the folders it is allowed
# below (the table), so no lower layer includes a higher one, and only the frontends read a dialect (api/) header.
# docs/architecture.md draws the same table. Also checks the namespace scheme: the core folders (what every layer
# reads, and the wiring) define their names in `keepwarm`, or in a function group `keepwarm::NAME` that is not a folder
# (log::, bounded_json::); each subsystem folder defines its names in `keepwarm::FOLDER` (and below it). A block of
# forward declarations only may name another namespace. Prints each offence; exits 1 if there is one.
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
    # The draft source of speculative decoding: token streams only, no model, so the engine and the bench share it.
    [spec]="base"
    [engine]="base cache spec"
    # serve --kv-events: the prefix cache's block reports over ZeroMQ; nothing of the engine's.
    [events]="base cache"
    [model]="base engine cache"
    [chat]="base json engine cache"
    [policy]="base json config chat"
    [api]="base json chat"
    # The contract between the routes and a backend (what a generation is, what it reports, what every frontend
    # shares): nothing of the engine's, so neither the routes nor the proxy see it.
    [backend]="base json config http chat policy api"
    [routes]="base json config http chat policy api backend"
    [local]="base json config http cache engine model chat policy api backend events"
    [proxy]="base json config http chat policy api backend"
    # Several models: the router in front of one child `keepwarm serve` per model. It never loads a model itself.
    [router]="base json config http"
    [bench]="base json config http cache engine model chat policy api spec"
    [commands]="base json config http cache engine model chat policy api backend routes local proxy bench spec router events"
)

# folders whose names live in keepwarm itself; every other folder is keepwarm::FOLDER.
core_folders="base json cache engine model chat backend routes local commands"

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

# The namespace each block of definitions opens, as FILE:LINE:NAME (blocks of forward declarations left out).
namespaces_defined() {
    awk '
        /^namespace keepwarm[a-z_:]* \{/ { name = $2; line = FNR; only_declarations = 1; next }
        name != "" && /^}  \/\/ namespace/ { if (!only_declarations) print FILENAME ":" line ":" name; name = ""; next }
        name != "" && !/^((class|struct) [a-z_]+;)?$/ { only_declarations = 0 }
    ' "$@"
}

all_folders=" $(ls -d */ | tr -d / | tr '\n' ' ') "
for dir in */; do
    dir=${dir%/}
    while IFS=: read -r file line name; do
        if [[ " $core_folders " == *" $dir "* ]]; then
            group=${name#keepwarm::}
            [[ "$name" == keepwarm ]] && continue
            [[ "$group" != *::* && "$all_folders" != *" $group "* ]] && continue
            expected="keepwarm (or a function group keepwarm::NAME)"
        else
            [[ "$name" == "keepwarm::$dir" || "$name" == "keepwarm::$dir::"* ]] && continue
            expected="keepwarm::$dir"
        fi
        echo "check-layers: src/$file:$line: namespace $name in $dir/, which defines its names in $expected" >&2
        status=1
    done < <(namespaces_defined $(find "$dir" -name '*.h' -o -name '*.cpp' | sort))
done
[[ $status == 0 ]] && echo "check-layers: every include in src/ follows the layer table, every namespace the scheme"
exit $status
