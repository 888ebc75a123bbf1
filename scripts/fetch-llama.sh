#!/usr/bin/env bash
# Fetches the pinned llama.cpp (source for headers/models/tools, prebuilt shared libraries for the engine)
# from the npm registry into a cache outside the build tree, verified against pinned integrity hashes.
# Prints the cache directory on stdout. Idempotent: a complete cache entry is reused as is.
set -euo pipefail

NLC_VERSION=3.21.1          # node-llama-cpp release that ships llama.cpp 80fb11a (library 0.4.0)
LLAMA_COMMIT=80fb11a
# Integrity hashes as reported by `npm view <pkg>@3.21.1 dist.integrity`.
SRC_INTEGRITY='sha512-E3N0Ev2Va0wzydvXYFwM9Hvyo07PoWjt8T/9GMc43Cvt8YkV/NU/tYUgEMC1grTPv2o9PRjQi0G3Wb5P/awiMg=='
BIN_INTEGRITY='sha512-Totj6RTDMGo3FoK2yNUaz/oGmZD0olAqTrRluFUWmu0kW2i9TOzHSW0OWCAiGkzRCVX0WsU2CyUQo/W2NYtdPA=='

cache_root="${KEEPWARM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/keepwarm}"
dest="$cache_root/llama.cpp-$LLAMA_COMMIT-nlc$NLC_VERSION-linux-x64"

if [[ -f "$dest/.complete" ]]; then
    echo "$dest"
    exit 0
fi

log() { echo "fetch-llama: $*" >&2; }

# shellcheck source=integrity.sh
source "$(dirname "${BASH_SOURCE[0]}")/integrity.sh"

work="$(mktemp -d "${TMPDIR:-/tmp}/keepwarm-llama.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log "downloading node-llama-cpp@$NLC_VERSION and @node-llama-cpp/linux-x64@$NLC_VERSION from the npm registry"
(cd "$work" && npm pack --silent "node-llama-cpp@$NLC_VERSION" "@node-llama-cpp/linux-x64@$NLC_VERSION" >&2)
verify "$work/node-llama-cpp-$NLC_VERSION.tgz" "$SRC_INTEGRITY"
verify "$work/node-llama-cpp-linux-x64-$NLC_VERSION.tgz" "$BIN_INTEGRITY"

mkdir -p "$work/src" "$work/bin"
tar xzf "$work/node-llama-cpp-$NLC_VERSION.tgz" -C "$work/src" package/llama
tar xzf "$work/node-llama-cpp-linux-x64-$NLC_VERSION.tgz" -C "$work/bin"

log "unpacking llama.cpp $LLAMA_COMMIT from the git bundle"
git -c advice.detachedHead=false clone --quiet "$work/src/package/llama/gitRelease.bundle" "$work/llama.cpp"
head="$(git -C "$work/llama.cpp" rev-parse --short=7 HEAD)"
if [[ "$head" != "$LLAMA_COMMIT" ]]; then
    log "bundle holds commit $head, expected $LLAMA_COMMIT"; exit 1
fi
# The prebuilt libraries carry node-llama-cpp's patches; apply them to the source too so both agree.
for p in "$work"/src/package/llama/patches/*.diff; do
    [[ -e "$p" ]] || continue
    git -C "$work/llama.cpp" apply "$p"
done
rm -rf "$work/llama.cpp/.git"

staging="$dest.partial"
rm -rf "$staging"
mkdir -p "$staging/lib"
mv "$work/llama.cpp" "$staging/source"
cp "$work"/bin/package/bins/linux-x64/*.so "$staging/lib/"
cp "$work/bin/package/bins/linux-x64/_nlcBuildMetadata.json" "$staging/lib/"
# Link-time names for the versioned sonames.
ln -sf libllama.v0.4.0.so "$staging/lib/libllama.so"
ln -sf libggml.v0.4.0.so "$staging/lib/libggml.so"
touch "$staging/.complete"
rm -rf "$dest"
mv "$staging" "$dest"
log "cached in $dest"
echo "$dest"
