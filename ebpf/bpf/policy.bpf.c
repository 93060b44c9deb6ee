// SPDX-License-Identifier: GPL-2.0
/* The default steering policy. From each completed batch it keeps, per
 * flow, decayed counts of small (< 64 KiB) and large ranges and the flow's
 * bytes in the current 100 ms window; a flow is latency-lane while at least
 * 7 of 8 of its ranges are small and it moves under 100 MiB a window
 * (~1 GiB/s: past that it is a stream, whatever its read size), else bulk. */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>

#include "sluice_steer.h"

/* Ranges in buckets below this are small: [1 B, 64 KiB). */
#define SMALL_BUCKETS 16
/* Counts halve when their sum passes this, so a flow that changes its
 * reads changes lane within a few hundred ranges. */
#define DECAY_AT 1024
#define WINDOW_NS (100ull * 1000 * 1000)
#define LATENCY_WINDOW_BYTES_MAX (100ull << 20)

struct flow_state {
    __u32 generation;
    __u32 pad;
    __u64 small_ranges;
    __u64 large_ranges;
    __u64 window_start_ns;
    __u64 window_bytes;
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, SLUICE_FLOWS_MAX);
    __type(key, __u32);
    __type(value, struct flow_state);
} flow_states SEC(".maps");

SEC("uprobe")
int lane_policy(struct pt_regs *ctx)
{
    struct sluice_batch_probe p;
    /* x86-64: the first argument is in rdi. */
    if (bpf_probe_read_user(&p, sizeof(p), (const void *)ctx->rdi))
        return 0;
    __u32 flow = p.flow;
    struct flow_state *st = bpf_map_lookup_elem(&flow_states, &flow);
    if (!st)
        return 0;
    __u64 now = bpf_ktime_get_ns();
    if (st->generation != p.flow_generation) {
        /* A new flow in a reused slot: forget its predecessor. */
        st->generation = p.flow_generation;
        st->small_ranges = 0;
        st->large_ranges = 0;
        st->window_start_ns = now;
        st->window_bytes = 0;
    }
    __u64 small = 0, large = 0;
#pragma unroll
    for (int i = 0; i < SLUICE_SIZE_BUCKETS; i++) {
        if (i < SMALL_BUCKETS)
            small += p.size_hist[i];
        else
            large += p.size_hist[i];
    }
    st->small_ranges += small;
    st->large_ranges += large;
    if (st->small_ranges + st->large_ranges > DECAY_AT) {
        st->small_ranges >>= 1;
        st->large_ranges >>= 1;
    }
    if (now - st->window_start_ns > WINDOW_NS) {
        st->window_start_ns = now;
        st->window_bytes = 0;
    }
    st->window_bytes += p.bytes;

    __u64 total = st->small_ranges + st->large_ranges;
    int small_reader = st->small_ranges * 8 >= total * 7;
    int streaming = st->window_bytes > LATENCY_WINDOW_BYTES_MAX;
    sluice_decide(&p, small_reader && !streaming ? SLUICE_DECISION_LATENCY : SLUICE_DECISION_BULK);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
