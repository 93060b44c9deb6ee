// SPDX-License-Identifier: GPL-2.0
/* The node's steering maps (sluice_steer.h) and its sk_reuseport program:
 * a new TCP connection from a peer the policy decided is a small-reader
 * goes to the latency-lane worker socket (index 0 of `workers`), every
 * other connection to the bulk-lane one (index 1). */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "sluice_steer.h"

#define WORKER_LATENCY 0
#define WORKER_BULK 1

struct {
    __uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, __u32);
} workers SEC(".maps");

SEC("sk_reuseport")
int select_worker(struct sk_reuseport_md *md)
{
    struct sluice_peer peer = {};
    if (md->eth_protocol == bpf_htons(ETH_P_IP)) {
        peer.addr[10] = 0xff;
        peer.addr[11] = 0xff;
        if (bpf_skb_load_bytes_relative(md, __builtin_offsetof(struct iphdr, saddr), &peer.addr[12], 4,
                                        BPF_HDR_START_NET))
            return SK_PASS;
    } else if (md->eth_protocol == bpf_htons(ETH_P_IPV6)) {
        if (bpf_skb_load_bytes_relative(md, __builtin_offsetof(struct ipv6hdr, saddr), peer.addr, 16,
                                        BPF_HDR_START_NET))
            return SK_PASS;
    } else {
        return SK_PASS;
    }
    __u32 *decision = bpf_map_lookup_elem(&peer_lanes, &peer);
    __u32 worker = decision && *decision == SLUICE_DECISION_LATENCY ? WORKER_LATENCY : WORKER_BULK;
    /* On failure (no socket at that index) the kernel's hash picks. */
    bpf_sk_select_reuseport(md, &workers, &worker, 0);
    return SK_PASS;
}

char LICENSE[] SEC("license") = "GPL";
