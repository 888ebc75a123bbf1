#!/usr/bin/env bash
# Every relative link in README.md and docs/*.md resolves: the file exists, and a `file.md#anchor` names a heading of
# that file under GitHub's slug rules. Prints FILE:LINE: LINK for each broken link and exits 1. URLs are not checked.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/check-links.py README.md docs/*.md
