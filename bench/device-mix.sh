#!/usr/bin/env bash
# The device's own floor for bench/steering.sh's mix, without sluice: fio
# (io_uring, O_DIRECT) runs a 4 KiB random reader that submits and reaps in
# batches of 16, alone, then beside one sequential 128 KiB reader held at a
# fixed depth (the bulk bytes at the device, as `bulk_in_flight_bytes`
# bounds them in the node), and that reader alone. Prints a Markdown table:
# per-read p99 of the small reader beside bulk over alone, and bulk MB/s
# beside the small reader over alone, for each depth. Needs fio
# (scripts/test.sh installs it).
#
#   bench/device-mix.sh [SIZE_MIB] [SECONDS] [BULK_DEPTHS...]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MIB=${1:-1024}
SECONDS_EACH=${2:-5}
shift $(($# < 2 ? $# : 2))
DEPTHS=${*:-4 8 16}
command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)" >&2; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/sluice-mix.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$WORK/data.bin"

global() {
    printf '[global]\nfilename=%s\ndirect=1\nioengine=io_uring\ntime_based=1\nruntime=%s\n' "$WORK/data.bin" "$SECONDS_EACH"
}
small_job() {
    printf '[small]\nrw=randread\nbs=4k\niodepth=16\niodepth_batch_submit=16\niodepth_batch_complete_min=16\n'
}
bulk_job() { # depth
    printf '[bulk]\nrw=read\nbs=128k\niodepth=%s\n' "$1"
}
# job name, field (p50 | p99 | mbs) from fio's JSON on stdin
field() {
    python3 -c '
import json, sys
name, what = sys.argv[1], sys.argv[2]
job = next(j for j in json.load(sys.stdin)["jobs"] if j["jobname"] == name)["read"]
p = job["clat_ns"]["percentile"]
print({"p50": p["50.000000"] / 1e3, "p99": p["99.000000"] / 1e3, "mbs": job["bw_bytes"] / 1e6}[what])
' "$@"
}
run() { # job text -> fio JSON
    fio --output-format=json <(cat)
}

{ global; small_job; } | run >"$WORK/small.json"
small_p99=$(field small p99 <"$WORK/small.json")
echo "small reader alone: p50 $(field small p50 <"$WORK/small.json" | xargs printf '%.0f') us, p99 $(printf '%.0f' "$small_p99") us"
echo
echo "| bulk at the device | bulk alone MB/s | small p50 beside, us | small p99 beside, us | bulk MB/s beside | p99 beside / alone | bulk beside / alone |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for depth in $DEPTHS; do
    { global; bulk_job "$depth"; } | run >"$WORK/bulk.json"
    { global; small_job; bulk_job "$depth"; } | run >"$WORK/mix.json"
    alone=$(field bulk mbs <"$WORK/bulk.json")
    p50=$(field small p50 <"$WORK/mix.json")
    p99=$(field small p99 <"$WORK/mix.json")
    beside=$(field bulk mbs <"$WORK/mix.json")
    python3 -c "
d, alone, p50, p99, beside, small = $depth, $alone, $p50, $p99, $beside, $small_p99
print(f'| {d * 128} KiB | {alone:.0f} | {p50:.0f} | {p99:.0f} | {beside:.0f} | {p99 / small:.2f} | {beside / alone:.2f} |')
"
done
