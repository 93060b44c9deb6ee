#!/usr/bin/env bash
# Two node configurations side by side: the same binary and bytes, both
# nodes up at once, measured alternately ROUNDS times (each side first in
# every other round), SECONDS each:
#   4 KiB random reads at QD 1: IOPS
#   4 KiB random reads at QD 32 (4 batches of 8 in flight): IOPS, or at
#     another depth with DEEP="BATCH INFLIGHT" (the suite's QD 256: "64 4")
#   1 MiB sequential reads, 16 in flight: GB/s
# then the medians and the ratio B / A. Nodes listen on loopback with
# TLS certificates made here (openssl) for 127.0.0.1, so either side may
# use --data-tls. IO_MODE=buffered (default: page cache, so the node's own
# work is what is measured) or direct (O_DIRECT). SLUICED_A / SLUICED_B
# name another `sluiced` for a side (a build of an earlier commit, say),
# so two versions are measured side by side as two configurations are.
#
#   [IO_MODE=direct] [SLUICED_A=path] [DEEP="64 4"] bench/ab.sh LABEL_A "FLAGS_A" LABEL_B "FLAGS_B" [ROUNDS] [SECONDS] [MiB]
set -euo pipefail
cd "$(dirname "$0")/.."
LABEL_A=$1 FLAGS_A=$2 LABEL_B=$3 FLAGS_B=$4
ROUNDS=${5:-3}
SECONDS_EACH=${6:-5}
MIB=${7:-512}
IO_MODE=${IO_MODE:-buffered}
read -r DEEP_BATCH DEEP_INFLIGHT DEEP_REST <<<"${DEEP:-8 4}"
[[ $DEEP_BATCH =~ ^[1-9][0-9]*$ && $DEEP_INFLIGHT =~ ^[1-9][0-9]*$ && -z $DEEP_REST ]] ||
    { echo "DEEP must be two positive whole numbers, \"BATCH INFLIGHT\": got \"$DEEP\"" >&2; exit 2; }
NAME=ab
. bench/node.sh

pki() {
    local d=$WORK/pki
    mkdir -p "$d"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=bench-ca \
        -keyout "$d/ca.key" -out "$d/ca.pem" -addext basicConstraints=critical,CA:TRUE \
        -addext keyUsage=critical,keyCertSign 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=node \
        -keyout "$d/node.key" -out "$d/node.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$d/node.ext"
    openssl x509 -req -in "$d/node.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 1 \
        -extfile "$d/node.ext" -out "$d/node.pem" 2>/dev/null
}

start() { # side (a|b), flags: a node in its own directory with the dataset sealed
    local side=$1 flags=$2 sluiced=$BIN/sluiced
    case $side in
    a) sluiced=${SLUICED_A:-$sluiced} ;;
    b) sluiced=${SLUICED_B:-$sluiced} ;;
    esac
    # shellcheck disable=SC2086 # the flags are words
    "$sluiced" --data-dir "$WORK/$side" --listen 127.0.0.1:0 --control 127.0.0.1:0 --io-mode "$IO_MODE" \
        --insecure $flags >"$WORK/$side.out" 2>"$WORK/$side.err" &
    for _ in $(seq 100); do grep -q "data plane" "$WORK/$side.out" 2>/dev/null && break; sleep 0.1; done
    grep -q "data plane" "$WORK/$side.out" || { cat "$WORK/$side.err" >&2; exit 1; }
    ctl "$side" dataset create data --kind bytes >/dev/null
    ctl "$side" dataset ingest data "$WORK/data.bin" >/dev/null
    ctl "$side" dataset seal data >/dev/null
}
ctl() { # side, args...
    local side=$1
    shift
    "$BIN/sluicectl" --endpoint "$(grep -o 'https\?://[0-9.:]*' "$WORK/$side.out" | head -1)" \
        --ca-file "$WORK/pki/ca.pem" "$@"
}
field() { sed "s/.*\"$1\":\([0-9.]*\).*/\1/"; }

pki
TLS_FLAGS="--tls-cert $WORK/pki/node.pem --tls-key $WORK/pki/node.key"
head -c $((MIB << 20)) /dev/urandom >"$WORK/data.bin"
start a "${FLAGS_A//@TLS@/$TLS_FLAGS}"
start b "${FLAGS_B//@TLS@/$TLS_FLAGS}"
for side in a b; do
    ctl "$side" --json bench read data --size 4096 --batch "$DEEP_BATCH" --inflight "$DEEP_INFLIGHT" --seconds 1 >/dev/null
done

: >"$WORK/results"
for round in $(seq "$ROUNDS"); do
    # Each side goes first in every other round: a side measured right
    # after the other meets what that one left behind (dirty pages, a
    # warm or cold CPU cache, the host's neighbours).
    if [ $((round % 2)) -eq 0 ]; then order="b a"; else order="a b"; fi
    for side in $order; do
        qd1=$(ctl "$side" --json bench read data --size 4096 --batch 1 --inflight 1 --seconds "$SECONDS_EACH" | field iops)
        iops=$(ctl "$side" --json bench read data --size 4096 --batch "$DEEP_BATCH" --inflight "$DEEP_INFLIGHT" \
            --seconds "$SECONDS_EACH" | field iops)
        gbs=$(ctl "$side" --json bench read data --size 1048576 --batch 1 --inflight 16 --sequential \
            --seconds "$SECONDS_EACH" | field gb_per_s)
        echo "$side $iops $gbs $qd1" >>"$WORK/results"
        echo "round $round $side: 4 KiB QD 1 $qd1 IOPS, $DEEP_BATCH x $DEEP_INFLIGHT $iops IOPS, 1 MiB sequential $gbs GB/s" >&2
    done
done
python3 - "$WORK/results" "$IO_MODE" "$LABEL_A" "$LABEL_B" "$DEEP_BATCH" "$DEEP_INFLIGHT" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
mode, a, b = sys.argv[2:5]
batch, inflight = int(sys.argv[5]), int(sys.argv[6])
med = lambda side, i: statistics.median(float(r[i]) for r in rows if r[0] == side)
a4, b4, a1, b1 = med("a", 1), med("b", 1), med("a", 2), med("b", 2)
aq, bq = med("a", 3), med("b", 3)
print(f"io mode {mode}, medians of {len(rows) // 2} rounds")
print(f"| workload | {a} | {b} | {b} / {a} |")
print("| --- | ---: | ---: | ---: |")
print(f"| 4 KiB random, QD 1 | {aq / 1e3:.1f} k IOPS | {bq / 1e3:.1f} k IOPS | {bq / aq:.2f} |")
print(f"| 4 KiB random, QD {batch * inflight} ({batch} x {inflight}) | {a4 / 1e3:.0f} k IOPS | {b4 / 1e3:.0f} k IOPS | {b4 / a4:.2f} |")
print(f"| 1 MiB sequential, 16 in flight | {a1:.2f} GB/s | {b1:.2f} GB/s | {b1 / a1:.2f} |")
PY
