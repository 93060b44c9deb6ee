# Shared by the bench/*.sh scripts (sourced): builds the release binaries
# and starts and stops one node in a scratch directory. The caller sets
# IO_MODE and NAME (the scratch directory's prefix). SLUICED names another
# `sluiced` for start_node (a build of an earlier commit, say), so a
# script's figures can be taken for two versions in turn; SLUICED_FLAGS
# adds flags to every node it starts (split at spaces), so they can be
# taken for two settings, e.g.
#   SLUICED_FLAGS="--bulk-in-flight-bytes 1048576" IO_MODE=direct bench/steering.sh 2 4
cargo build --release -q --bin sluiced --bin sluicectl
BIN=target/release
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/sluice-$NAME.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

start_node() { # extra flags
    # Gone before the node starts: the shell opens the new one in the
    # background, and the wait below must not read a stopped node's lines.
    rm -f "$WORK/node.out"
    "${SLUICED:-$BIN/sluiced}" --data-dir "$WORK/node" --listen 127.0.0.1:0 --control 127.0.0.1:0 --io-mode "$IO_MODE" --insecure ${SLUICED_FLAGS:-} "$@" \
        >"$WORK/node.out" 2>"$WORK/node.err" &
    NODE_PID=$!
    for _ in $(seq 100); do grep -q "data plane" "$WORK/node.out" 2>/dev/null && break; sleep 0.1; done
    export SLUICE_ENDPOINT=$(grep -o 'https\?://[0-9.:]*' "$WORK/node.out" | head -1)
}
stop_node() { kill "$NODE_PID"; wait "$NODE_PID" || true; }

# A sealed `bytes` dataset of random bytes: name, MiB.
sealed_dataset() { # name, MiB
    start_node
    head -c $(($2 << 20)) /dev/urandom >"$WORK/data.bin"
    "$BIN/sluicectl" dataset create "$1" --kind bytes >/dev/null
    "$BIN/sluicectl" dataset ingest "$1" "$WORK/data.bin" >/dev/null
    "$BIN/sluicectl" dataset seal "$1" >/dev/null
    stop_node
}
