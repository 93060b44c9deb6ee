#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 15) from its committed
# seed corpus; fails on the first crash. Needs the nightly toolchain and
# cargo-fuzz (scripts/test.sh installs cargo-fuzz).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
SECONDS_EACH=${1:-15}
WORK=${FUZZ_WORK:-$(mktemp -d)}
for target in $(cargo +nightly fuzz list); do
    mkdir -p "$WORK/$target"
    echo "== fuzz $target (${SECONDS_EACH}s)"
    if ! cargo +nightly fuzz run "$target" "$WORK/$target" "corpus/$target" -- \
        -max_total_time="$SECONDS_EACH" >"$WORK/$target.log" 2>&1; then
        tail -40 "$WORK/$target.log"
        echo "fuzz target $target failed; its input is in fuzz/artifacts/$target" >&2
        exit 1
    fi
    grep -E "^Done" "$WORK/$target.log" || true
done
