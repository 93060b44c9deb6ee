// SPDX-License-Identifier: GPL-2.0
/* Trace of the sluice data plane, from uprobes on its probe ABI: per
 * (dataset, lane) counters, a log2 histogram of range sizes and of batch
 * latency, and a ring buffer of batches slower than a threshold. */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>

#include "sluice_probes.h"

#define LATENCY_BUCKETS 32

struct trace_key {
    __u64 dataset_id;
    __u32 lane;
    __u32 pad;
};

struct trace_stats {
    __u64 batches;
    __u64 ranges;
    __u64 bytes;
    __u64 failed_ranges;
    __u64 size_log2[SLUICE_SIZE_BUCKETS];
    __u64 latency_log2_us[LATENCY_BUCKETS];
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, struct trace_key);
    __type(value, struct trace_stats);
} trace_stats SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 1 << 18);
} slow_batches SEC(".maps");

/* [0]: all zeros, the initial value of new entries (too big for the
 * 512-byte BPF stack). */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct trace_stats);
} zero_stats SEC(".maps");

/* [0]: batches slower than this many nanoseconds go to slow_batches. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} slow_threshold_ns SEC(".maps");

static __always_inline __u32 log2_bucket(__u64 v, __u32 max)
{
    __u32 b = 0;
    for (int i = 0; i < 63; i++) {
        if (v >> 1 == 0)
            break;
        v >>= 1;
        b++;
    }
    return b < max ? b : max - 1;
}

SEC("uprobe")
int batch_complete(struct pt_regs *ctx)
{
    struct sluice_batch_probe p;
    /* x86-64: the first argument is in rdi. */
    if (bpf_probe_read_user(&p, sizeof(p), (const void *)ctx->rdi))
        return 0;
    struct trace_key key = { .dataset_id = p.dataset_id, .lane = p.lane, .pad = 0 };
    __u32 zero_key = 0;
    struct trace_stats *stats = bpf_map_lookup_elem(&trace_stats, &key);
    if (!stats) {
        struct trace_stats *zero = bpf_map_lookup_elem(&zero_stats, &zero_key);
        if (!zero)
            return 0;
        bpf_map_update_elem(&trace_stats, &key, zero, BPF_NOEXIST);
        stats = bpf_map_lookup_elem(&trace_stats, &key);
        if (!stats)
            return 0;
    }
    __sync_fetch_and_add(&stats->batches, 1);
    __sync_fetch_and_add(&stats->ranges, p.ranges);
    __sync_fetch_and_add(&stats->bytes, p.bytes);
    __sync_fetch_and_add(&stats->failed_ranges, p.failed_ranges);
#pragma unroll
    for (int i = 0; i < SLUICE_SIZE_BUCKETS; i++) {
        if (p.size_hist[i])
            __sync_fetch_and_add(&stats->size_log2[i], p.size_hist[i]);
    }
    __u64 latency_ns = p.complete_ns > p.submit_ns ? p.complete_ns - p.submit_ns : 0;
    __u32 bucket = log2_bucket(latency_ns / 1000, LATENCY_BUCKETS);
    if (bucket < LATENCY_BUCKETS)
        __sync_fetch_and_add(&stats->latency_log2_us[bucket], 1);

    __u64 *threshold = bpf_map_lookup_elem(&slow_threshold_ns, &zero_key);
    if (threshold && *threshold && latency_ns >= *threshold)
        bpf_ringbuf_output(&slow_batches, &p, sizeof(p), 0);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
