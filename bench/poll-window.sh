#!/usr/bin/env bash
# The client's poll window (SLUICE_POLL_WINDOW_US) side by side: one node,
# one 64 MiB dataset, 4 KiB random reads, each window in turn ROUNDS times
# for SECONDS each, then each window's median IOPS and batch p50. Each
# round starts one window later than the last, so that no window is
# always measured first (on a 2-vCPU VM the run after another read ~7 %
# more at QD 1 whatever it ran, bench/ab.sh's reason to alternate). Needs
# `cargo build --release --bin sluiced --bin sluicectl`.
# IO_MODE=buffered (default: page cache) or direct (O_DIRECT).
#
#   [IO_MODE=direct] [WINDOWS="0 50"] bench/poll-window.sh BATCH INFLIGHT [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
BATCH=$1 INFLIGHT=$2
ROUNDS=${3:-3}
SECONDS_EACH=${4:-3}
WINDOWS=${WINDOWS:-0 50}
IO_MODE=${IO_MODE:-buffered}
NAME=poll-window
. bench/node.sh
sealed_dataset data 64
start_node

read_once() { # window, seconds
    SLUICE_POLL_WINDOW_US=$1 "$BIN/sluicectl" --json bench read data --size 4096 \
        --batch "$BATCH" --inflight "$INFLIGHT" --seconds "$2"
}
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

read_once 50 1 >/dev/null # warm the node and the page cache
declare -A IOPS P50
read -ra ORDER <<<"$WINDOWS"
for round in $(seq "$ROUNDS"); do
    for i in "${!ORDER[@]}"; do
        w=${ORDER[$(((i + round - 1) % ${#ORDER[@]}))]}
        out=$(read_once "$w" "$SECONDS_EACH")
        iops=$(sed 's/.*"iops":\([0-9.]*\).*/\1/' <<<"$out")
        p50=$(sed 's/.*"batch_latency_us_p50":\([0-9]*\).*/\1/' <<<"$out")
        echo "round $round window ${w} µs: $iops IOPS, p50 $p50 µs"
        IOPS[$w]+="$iops "
        P50[$w]+="$p50 "
    done
done
stop_node
echo "$BATCH × $INFLIGHT, $IO_MODE, medians of $ROUNDS:"
for w in $WINDOWS; do
    printf '  window %5s µs: %10.0f IOPS, p50 %s µs\n' "$w" \
        "$(tr ' ' '\n' <<<"${IOPS[$w]}" | grep . | median)" \
        "$(tr ' ' '\n' <<<"${P50[$w]}" | grep . | median)"
done
