#!/usr/bin/env bash
# TLS on the TCP data port against plain TCP: one node with --data-tls and
# one without, the same bytes, run alternately ROUNDS times, SECONDS each:
#   4 KiB random reads at QD 32 (4 batches of 8 in flight): IOPS
#   1 MiB sequential reads, 16 in flight: GB/s
# and the ratio TLS / plain of the medians. Certificates are made here
# (openssl) for 127.0.0.1. IO_MODE=buffered (default: page cache, so the
# transport is what is measured) or direct (O_DIRECT).
#
#   [IO_MODE=direct] bench/tls.sh [ROUNDS] [SECONDS] [MiB]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_EACH=${2:-5}
MIB=${3:-512}
IO_MODE=${IO_MODE:-buffered}
NAME=tls
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

start() { # label, flags...: a node in its own directory; sets its endpoint in ENDPOINT_<label>
    local label=$1
    shift
    "$BIN/sluiced" --data-dir "$WORK/$label" --listen 127.0.0.1:0 --control 127.0.0.1:0 --io-mode "$IO_MODE" \
        --insecure "$@" >"$WORK/$label.out" 2>"$WORK/$label.err" &
    for _ in $(seq 100); do grep -q "data plane" "$WORK/$label.out" 2>/dev/null && break; sleep 0.1; done
    local endpoint
    endpoint=$(grep -o 'https\?://[0-9.:]*' "$WORK/$label.out" | head -1)
    eval "ENDPOINT_$label=$endpoint"
    ctl "$label" dataset create data --kind bytes >/dev/null
    ctl "$label" dataset ingest data "$WORK/data.bin" >/dev/null
    ctl "$label" dataset seal data >/dev/null
}
ctl() { # label, args...
    local label=$1
    shift
    local endpoint
    eval "endpoint=\$ENDPOINT_$label"
    "$BIN/sluicectl" --endpoint "$endpoint" --ca-file "$WORK/pki/ca.pem" "$@"
}
field() { sed "s/.*\"$1\":\([0-9.]*\).*/\1/"; }

pki
head -c $((MIB << 20)) /dev/urandom >"$WORK/data.bin"
start plain
start tls --tls-cert "$WORK/pki/node.pem" --tls-key "$WORK/pki/node.key" --data-tls
for label in plain tls; do ctl "$label" --json bench read data --size 4096 --batch 8 --inflight 4 --seconds 1 >/dev/null; done

: >"$WORK/results"
for round in $(seq "$ROUNDS"); do
    for label in plain tls; do
        iops=$(ctl "$label" --json bench read data --size 4096 --batch 8 --inflight 4 --seconds "$SECONDS_EACH" | field iops)
        gbs=$(ctl "$label" --json bench read data --size 1048576 --batch 1 --inflight 16 --sequential \
            --seconds "$SECONDS_EACH" | field gb_per_s)
        echo "$label $iops $gbs" >>"$WORK/results"
        echo "round $round $label: 4 KiB QD 32 $iops IOPS, 1 MiB sequential $gbs GB/s" >&2
    done
done
python3 - "$WORK/results" "$IO_MODE" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
med = lambda label, i: statistics.median(float(r[i]) for r in rows if r[0] == label)
p4, t4, p1, t1 = med("plain", 1), med("tls", 1), med("plain", 2), med("tls", 2)
print(f"io mode {sys.argv[2]}, medians of {len(rows) // 2} rounds")
print("| workload | plain TCP | TLS data port | TLS / plain |")
print("| --- | ---: | ---: | ---: |")
print(f"| 4 KiB random, QD 32 (8 x 4) | {p4 / 1e3:.0f} k IOPS | {t4 / 1e3:.0f} k IOPS | {t4 / p4:.2f} |")
print(f"| 1 MiB sequential, 16 in flight | {p1:.2f} GB/s | {t1:.2f} GB/s | {t1 / p1:.2f} |")
PY
