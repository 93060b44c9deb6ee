#!/usr/bin/env bash
# Served 4 KiB random reads (`sluicectl bench read`, client -> TCP -> node ->
# io_uring) next to fio's io_uring random reads of the same file at the same
# total queue depth, once with O_DIRECT and once through the page cache, in
# one run. Prints a Markdown table. Needs fio (scripts/test.sh installs it).
#
#   bench/fio-compare.sh [SIZE_MIB] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MIB=${1:-1024}
SECONDS_EACH=${2:-10}
command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)" >&2; exit 1; }
cargo build --release -q --bin sluiced --bin sluicectl
BIN=target/release
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/sluice-bench.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

start_node() { # io mode
    rm -f "$WORK/node.out" # the wait below must not read a stopped node's lines
    "$BIN/sluiced" --data-dir "$WORK/node" --listen 127.0.0.1:0 --control 127.0.0.1:0 --io-mode "$1" --insecure \
        >"$WORK/node.out" 2>"$WORK/node.err" &
    NODE_PID=$!
    for _ in $(seq 100); do grep -q "control API on" "$WORK/node.out" 2>/dev/null && break; sleep 0.1; done
    export SLUICE_ENDPOINT=$(grep -o 'http://[0-9.:]*' "$WORK/node.out")
}
stop_node() { kill "$NODE_PID"; wait "$NODE_PID" || true; }

start_node direct
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$WORK/data.bin"
"$BIN/sluicectl" dataset create bench --kind bytes >/dev/null
"$BIN/sluicectl" dataset ingest bench "$WORK/data.bin" >/dev/null
"$BIN/sluicectl" dataset seal bench >/dev/null
rm "$WORK/data.bin"
NS=$("$BIN/sluicectl" dataset stat bench --json | sed 's/.*"path":"\([^"]*\)".*/\1/')

sluice_iops() { # batch inflight
    "$BIN/sluicectl" bench read bench --size 4096 --batch "$1" --inflight "$2" --seconds "$SECONDS_EACH" --json |
        sed 's/.*"iops":\([0-9.]*\).*/\1/'
}
fio_iops() { # direct qd  (invalidate=0: keep the warmed page cache in buffered mode)
    fio --name=peer --filename="$NS" --ioengine=io_uring --direct="$1" --invalidate=0 --rw=randread --bs=4k \
        --iodepth="$2" --numjobs=1 --time_based --runtime="$SECONDS_EACH" --size="${SIZE_MIB}M" \
        --output-format=json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["iops"])'
}

echo "| mode | queue depth | sluice (batch x in flight) IOPS | fio io_uring IOPS | sluice / fio |"
echo "| --- | --- | --- | --- | --- |"
row() { # mode direct batch inflight
    local qd=$(($3 * $4)) s f
    s=$(sluice_iops "$3" "$4")
    f=$(fio_iops "$2" "$qd")
    printf '| %s | %d | %.0f (%d x %d) | %.0f | %.2f |\n' "$1" "$qd" "$s" "$3" "$4" "$f" "$(python3 -c "print($s/$f)")"
}
row O_DIRECT 1 32 1
row O_DIRECT 1 8 4
row O_DIRECT 1 32 2
row O_DIRECT 1 64 4
stop_node
start_node buffered
# Warm the page cache so both sides read from memory.
cat "$NS" >/dev/null
row "page cache" 0 32 1
row "page cache" 0 64 4
stop_node
