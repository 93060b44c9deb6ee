#!/usr/bin/env bash
# Verification of every read (per 4 KiB block checksums, the default)
# against none (verify_chunks = false), bench/ab.sh:
#   [IO_MODE=direct] bench/verify.sh [ROUNDS] [SECONDS] [MiB]
set -euo pipefail
off=$(mktemp "${TMPDIR:-/var/tmp}/sluice-verify-off.XXXXXX.toml")
trap 'rm -f "$off"' EXIT
echo "verify_chunks = false" >"$off"
"$(dirname "$0")/ab.sh" "verification off" "--config $off" "every read verified" "" "$@"
