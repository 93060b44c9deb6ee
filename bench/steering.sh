#!/usr/bin/env bash
# Small reads beside bulk reads on one node: the small-read client's batch
# latency and the bulk clients' throughput under three lane set-ups,
# alternating ROUNDS times, SECONDS each:
#   one-lane   --latency-lane-max-bytes 0: every batch in one FIFO lane
#   threshold  the size threshold alone (batches <= 512 KiB first; no eBPF)
#   ebpf       --ebpf: the default policy decides per flow, and the
#              sk_reuseport program puts the small reader's connection on
#              the latency-lane workers (a 1 s warm-up lets the policy see
#              the peer before the measured connection opens)
#   alone      --ebpf, the small reader alone and then the bulk readers
#              alone: what the ebpf row is held against
# The last lines are the steering goals as ratios of the medians over the
# rounds: the small reader's p99 beside bulk over its p99 alone (goal
# <= 1.5), and bulk GB/s beside the small reader over bulk alone (>= 0.95).
# The small reader leaves from 127.0.0.2 and the bulk readers from
# 127.0.0.3 (SLUICE_SOURCE_ADDR), so the node can tell the peers apart.
# IO_MODE=buffered (default: page cache, CPU-bound) or direct (O_DIRECT).
# Needs root for --ebpf.
#
#   [IO_MODE=direct] bench/steering.sh [ROUNDS] [SECONDS] [BULK_CLIENTS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_EACH=${2:-5}
BULK_CLIENTS=${3:-2}
IO_MODE=${IO_MODE:-buffered}
NAME=steer
. bench/node.sh
small() { # seconds [batch, default 16]
    SLUICE_SOURCE_ADDR=127.0.0.2 "$BIN/sluicectl" bench read steer --size 4096 --batch "${2:-16}" --inflight 1 --seconds "$1" --json
}
bulk() { # seconds
    SLUICE_SOURCE_ADDR=127.0.0.3 "$BIN/sluicectl" bench read steer --size 1048576 --batch 4 --inflight 4 --seconds "$1" --json
}
bulk_clients() { # BULK_CLIENTS bulk readers in the background, SECONDS_EACH
    for i in $(seq "$BULK_CLIENTS"); do bulk "$SECONDS_EACH" >"$WORK/bulk.$i.json" & done
}
field() { sed "s/.*\"$1\":\([0-9.]*\).*/\1/"; }

run() { # name, node flags...
    local name=$1
    shift
    start_node "$@"
    if [ "$name" = ebpf ] || [ "$name" = alone ]; then
        "$BIN/sluicectl" --json policy show | grep -q '"available":true' || { echo "steering did not start (root?)" >&2; exit 1; }
        # The small reader warms up one 4 KiB read at a time: well under the
        # default policy's stream rule (100 MiB in 100 ms), which its batches
        # of 16 can cross alone on a page-cached node, making the peer's
        # decision, and so where its next connection goes, a toss-up.
        small 1 1 >/dev/null
        bulk 1 >/dev/null
    fi
    if [ "$name" = alone ]; then
        small "$SECONDS_EACH" >"$WORK/small.json"
        bulk_clients
    else
        bulk_clients
        sleep 0.5
        small "$SECONDS_EACH" >"$WORK/small.json"
    fi
    wait $(jobs -p | grep -v "^$NODE_PID\$") 2>/dev/null || true
    local workers=""
    if [ "$name" = ebpf ]; then
        workers=$("$BIN/sluicectl" --json policy show | sed 's/.*"latency_workers":\([0-9]*\).*/\1/')
    fi
    stop_node
    local gbs=0
    for i in $(seq "$BULK_CLIENTS"); do gbs=$(python3 -c "print($gbs + $(field gb_per_s <"$WORK/bulk.$i.json"))"); done
    local p99
    p99=$(field batch_latency_us_p99 <"$WORK/small.json")
    printf '| %d | %s | %s | %s | %s | %.0f | %.2f | %s |\n' "$round" "$name" \
        "$(field batch_latency_us_p50 <"$WORK/small.json")" "$p99" \
        "$(field batch_latency_us_p999 <"$WORK/small.json")" "$(field iops <"$WORK/small.json")" "$gbs" "${workers:--}"
    echo "$name $p99 $gbs" >>"$WORK/figures"
}

# The steering goals from the ebpf and alone rows' medians.
goals() {
    python3 - "$WORK/figures" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
def median(name, column):
    return statistics.median(float(r[column]) for r in rows if r[0] == name)
p99 = median("ebpf", 1) / median("alone", 1)
bulk = median("ebpf", 2) / median("alone", 2)
print()
print(f"small-read p99 beside bulk / alone (ebpf, medians): {p99:.2f} (goal <= 1.5: {'met' if p99 <= 1.5 else 'not met'})")
print(f"bulk GB/s beside small reads / alone (ebpf, medians): {bulk:.2f} (goal >= 0.95: {'met' if bulk >= 0.95 else 'not met'})")
PY
}

sealed_dataset steer 256

echo "| round | lanes | small p50 us | small p99 us | small p99.9 us | small reads/s | bulk GB/s | latency-worker connections |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for round in $(seq "$ROUNDS"); do
    run one-lane --latency-lane-max-bytes 0
    run threshold
    run ebpf --ebpf
    run alone --ebpf
done
goals
