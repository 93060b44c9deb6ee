#!/usr/bin/env bash
# The crate layout's dependency rules (README, "Crates"): fails naming the
# rule and the path through which it broke.
#   - sluice-proto and sluice-sampler depend on no other sluice crate;
#   - the client (and so the Python wheel) links neither the storage node's
#     data plane, its control plane, nor its servers;
#   - sluice-transport (the client's transports) links none of those either;
#   - sluicectl talks to the node through the client and links none of them.
set -euo pipefail
cd "$(dirname "$0")/.."

fail=0
# forbid PACKAGE FEATURES PATTERN WHY
forbid() {
    local package=$1 features=$2 pattern=$3 why=$4
    local tree found
    # A tree cargo cannot make fails the check (set -e), never passes it.
    tree=$(cargo tree -p "$package" $features -e normal --prefix none)
    found=$(echo "$tree" | awk -v self="$package" '$1 != self {print $1}' | sort -u | grep -Ex "$pattern" || true)
    if [ -n "$found" ]; then
        echo "layout: $package depends on $(echo "$found" | tr '\n' ' ')- $why" >&2
        cargo tree -p "$package" $features -e normal -i "$(echo "$found" | head -1)" >&2 || true
        fail=1
    fi
}

node_side='sluice-(dataplane|control|serve|ebpf)|sluice'
forbid sluice-proto "" 'sluice-.*|sluice' "the vocabulary crate stands alone"
forbid sluice-sampler "" 'sluice-.*|sluice' "the sampler is pure and stands alone"
for features in "" "--features rdma"; do
    forbid sluice-transport "$features" "$node_side" "a training host's transports must not link the storage node"
    forbid sluice-client "$features" "$node_side" "a training host must not link the storage node"
done
if [ -f ctl/Cargo.toml ]; then
    forbid sluicectl "" "$node_side" "sluicectl speaks the API through the client"
fi
if [ "$fail" -ne 0 ]; then
    exit 1
fi
echo "layout: dependency rules hold"
