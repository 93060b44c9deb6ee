#!/usr/bin/env bash
# Cost of the eBPF probes: `sluicectl bench read` (4 KiB, batches of 64) on
# the same dataset with the node started with and without --ebpf (trace,
# default steering policy, io_uring tracepoints, sk_reuseport), alternating
# ROUNDS times, SECONDS each. IO_MODE=buffered (default: page cache, the
# CPU-bound worst case) or direct (O_DIRECT, device-bound). PROBES=uprobes
# leaves out the io_uring tracepoints (--no-kernel-trace), to see the
# per-batch probes alone. Needs root.
#
#   [IO_MODE=direct] [PROBES=uprobes] bench/probe-overhead.sh [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_EACH=${2:-5}
IO_MODE=${IO_MODE:-buffered}
NAME=probe
. bench/node.sh
iops() {
    "$BIN/sluicectl" bench read probe --size 4096 --batch 64 --inflight 2 --seconds "$SECONDS_EACH" --json |
        sed 's/.*"iops":\([0-9.]*\).*/\1/'
}

sealed_dataset probe 256

echo "| round | IOPS without probes | IOPS with --ebpf | with / without |"
echo "| --- | --- | --- | --- |"
for round in $(seq "$ROUNDS"); do
    start_node; off=$(iops); stop_node
    if [ "${PROBES:-all}" = uprobes ]; then start_node --ebpf --no-kernel-trace; else start_node --ebpf; fi
    on=$(iops)
    "$BIN/sluicectl" top --json --once | grep -q '"available":true' || { echo "eBPF did not attach (root?)" >&2; exit 1; }
    stop_node
    printf '| %d | %.0f | %.0f | %.3f |\n' "$round" "$off" "$on" "$(python3 -c "print($on/$off)")"
done
