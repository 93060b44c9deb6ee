/* The maps a steering policy shares with the node, for BPF programs only.
 * The node creates them (bpf/steer.bpf.o) and hands them to every policy
 * it loads by name, so a policy must declare them exactly as here:
 * include this header.
 *
 * lane_decisions: one SLUICE_DECISION_* (a __u64) per flow (a dataset opened on a
 *   connection), indexed by the probe's `flow`; the data plane mmaps it
 *   and reads it per batch.
 * peer_lanes: a decision per peer address (IPv6 or IPv4-mapped), which
 *   the node's sk_reuseport program reads to put the peer's next TCP
 *   connections on latency-lane or bulk-lane workers. */
#ifndef SLUICE_STEER_H
#define SLUICE_STEER_H

#include "sluice_probes.h"

#define SLUICE_PEERS_MAX 65536

struct sluice_peer {
    __u8 addr[16];
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(map_flags, BPF_F_MMAPABLE);
    __uint(max_entries, SLUICE_FLOWS_MAX);
    __type(key, __u32);
    /* __u64: array elements are 8-byte aligned, so the mmapped array is
     * one __u64 per flow whatever the value type; say so. */
    __type(value, __u64);
} lane_decisions SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, SLUICE_PEERS_MAX);
    __type(key, struct sluice_peer);
    __type(value, __u32);
} peer_lanes SEC(".maps");

/* Writes `decision` for the probe's flow and peer (only when it changes,
 * so a steady flow dirties no cache line the data plane reads). */
static __always_inline void sluice_decide(const struct sluice_batch_probe *p, __u32 decision)
{
    __u32 flow = p->flow;
    if (flow >= SLUICE_FLOWS_MAX)
        return;
    __u64 *slot = bpf_map_lookup_elem(&lane_decisions, &flow);
    if (slot && *slot != decision)
        *slot = decision;
    struct sluice_peer peer;
    __builtin_memcpy(peer.addr, p->peer, sizeof(peer.addr));
    __u32 *known = bpf_map_lookup_elem(&peer_lanes, &peer);
    if (!known || *known != decision)
        bpf_map_update_elem(&peer_lanes, &peer, &decision, BPF_ANY);
}

#endif
