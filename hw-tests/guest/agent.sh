#!/bin/sh
# The rig's agent in a guest, run from the host's own /bin/sh. It configures
# the guest from /rig/<host>/env, says it is ready, then runs every script
# the rig drops into /rig/<host>/req/ (each in the background, under a time
# limit) and leaves its output and exit status in /rig/<host>/out/.
host=$1
dir=/rig/$host
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
. "$dir/env"
hostname "$host"
ip link set lo up
if [ -n "$RIG_ADDR" ]; then
    ip addr add "$RIG_ADDR/24" dev eth0 && ip link set eth0 up || echo "rig: network setup failed"
    # A permanent neighbour entry: when an ARP entry goes stale, the kernel
    # re-probes and drops what overflows its small queue meanwhile; a burst
    # of soft-RoCE packets lost that way sends rxe into a retry it does not
    # always recover from.
    if [ -n "$RIG_PEER_ADDR" ]; then
        ip neigh replace "$RIG_PEER_ADDR" lladdr "$RIG_PEER_MAC" dev eth0 nud permanent || echo "rig: neighbour setup failed"
    fi
fi
if [ "$RIG_RDMA" = 1 ]; then
    rdma link add rxe0 type rxe netdev eth0 || echo "rig: rxe setup failed"
fi
if [ -n "$RIG_HUGEPAGES" ]; then
    echo "$RIG_HUGEPAGES" > /proc/sys/vm/nr_hugepages
    # DPDK (SPDK's env) finds hugepages through a mounted hugetlbfs.
    mkdir -p /dev/hugepages
    grep -q " /dev/hugepages hugetlbfs" /proc/mounts || mount -t hugetlbfs nodev /dev/hugepages \
        || echo "rig: hugetlbfs mount failed"
fi
mkdir -p "$dir/req" "$dir/run" "$dir/out"
echo ready > "$dir/ready"
while :; do
    for req in "$dir"/req/*.sh; do
        [ -e "$req" ] || continue
        n=$(basename "$req" .sh)
        limit=$(cat "$dir/req/$n.limit" 2>/dev/null || echo 60)
        mv "$req" "$dir/run/$n.sh"
        (
            cd /root 2>/dev/null || cd /
            timeout -s KILL "$limit" sh "$dir/run/$n.sh" > "$dir/out/$n.stdout" 2> "$dir/out/$n.stderr" < /dev/null
            echo $? > "$dir/out/$n.rc.tmp"
            mv "$dir/out/$n.rc.tmp" "$dir/out/$n.rc"
        ) &
    done
    sleep 0.05
done
