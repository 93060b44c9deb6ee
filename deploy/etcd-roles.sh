#!/usr/bin/env bash
# Makes the etcd role and user of one sluice node: it may read the whole
# cluster prefix, write its own copies (replicas/NODE/) and membership
# (members/NODE), and the keys every node writes (datasets/, crcs/,
# grants/, meta/), and nothing else: not another node's copies or
# membership, not another cluster's prefix.
#
#   deploy/etcd-roles.sh PREFIX NODE PASSWORD_FILE
#
# Run as etcd's root user once auth is set up (deploy/README.md), with
# etcdctl's usual environment: ETCDCTL_ENDPOINTS, ETCDCTL_CACERT,
# ETCDCTL_CERT, ETCDCTL_KEY, ETCDCTL_USER (root:PASSWORD). Running it again
# for the same node changes nothing.
set -euo pipefail
if [ $# -ne 3 ]; then
    echo "usage: $0 PREFIX NODE PASSWORD_FILE" >&2
    exit 2
fi
prefix="${1%/}"
node="$2"
password_file="$3"
case "$node" in
    *[!A-Za-z0-9._-]* | "") echo "$0: node id '$node' is not [A-Za-z0-9._-]+" >&2; exit 2 ;;
esac
role="sluice-node-$node"

# `add` of what exists fails; anything else failing is an error.
add() {
    local out
    if ! out=$(etcdctl "$@" 2>&1); then
        case "$out" in
            *"already exists"*) ;;
            *) echo "$out" >&2; return 1 ;;
        esac
    fi
}

add role add "$role"
etcdctl role grant-permission "$role" read --prefix=true "$prefix/" >/dev/null
etcdctl role grant-permission "$role" readwrite --prefix=true "$prefix/replicas/$node/" >/dev/null
etcdctl role grant-permission "$role" readwrite "$prefix/members/$node" >/dev/null
for shared in datasets/ crcs/ grants/ meta/; do
    etcdctl role grant-permission "$role" readwrite --prefix=true "$prefix/$shared" >/dev/null
done
add user add "$node" --new-user-password="$(head -n 1 "$password_file")"
etcdctl user grant-role "$node" "$role" >/dev/null
echo "etcd user $node has role $role on $prefix/"
