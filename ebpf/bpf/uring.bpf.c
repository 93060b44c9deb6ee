// SPDX-License-Identifier: GPL-2.0
/* The kernel's side of the node's I/O: io_uring tracepoints give each
 * request's time from submission to completion, for the node's own
 * process only, as a log2 histogram of microseconds beside the probes'
 * batch latency. Every 2^sample_shift-th request a CPU submits is timed
 * (request objects are recycled, so their addresses would be a biased
 * sample); the others cost a counter increment and, at completion, one
 * hash lookup that misses. Fields are read at the offsets 6.1 and 6.18
 * share (events/io_uring/io_uring_{submit_req,complete}/format; on 6.1
 * the first is io_uring_submit_sqe, which the loader falls back to). */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define LATENCY_BUCKETS 32

struct submit_req_args {
    __u64 common;
    __u64 ctx;
    __u64 req;
    __u64 user_data;
};

struct complete_args {
    __u64 common;
    __u64 ctx;
    __u64 req;
    __u64 user_data;
    __s32 res;
};

struct uring_config {
    __u32 tgid;          /* the process whose requests count */
    __u32 sample_shift;  /* time one request in 2^sample_shift */
};

/* [0]: set by the loader. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct uring_config);
} config SEC(".maps");

/* [0]: requests this CPU submitted for the target. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} submits SEC(".maps");

/* In-flight requests of the target: request pointer -> submit time. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u64);
    __type(value, __u64);
} started SEC(".maps");

struct uring_stats {
    __u64 requests;      /* timed (sampled) requests */
    __u64 errors;
    __u64 latency_log2_us[LATENCY_BUCKETS];
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct uring_stats);
} uring_stats SEC(".maps");

SEC("tracepoint/io_uring/io_uring_submit_req")
int submit_req(struct submit_req_args *args)
{
    __u32 zero = 0;
    struct uring_config *cfg = bpf_map_lookup_elem(&config, &zero);
    if (!cfg || (bpf_get_current_pid_tgid() >> 32) != cfg->tgid)
        return 0;
    __u64 *count = bpf_map_lookup_elem(&submits, &zero);
    if (!count)
        return 0;
    __u64 n = (*count)++;
    __u32 shift = cfg->sample_shift < 16 ? cfg->sample_shift : 16;
    if (n & ((1ull << shift) - 1))
        return 0;
    __u64 req = args->req;
    __u64 now = bpf_ktime_get_ns();
    bpf_map_update_elem(&started, &req, &now, BPF_ANY);
    return 0;
}

SEC("tracepoint/io_uring/io_uring_complete")
int complete(struct complete_args *args)
{
    __u64 req = args->req;
    __u64 *start = bpf_map_lookup_elem(&started, &req);
    if (!start)
        return 0;
    __u64 us = (bpf_ktime_get_ns() - *start) / 1000;
    bpf_map_delete_elem(&started, &req);
    __u32 zero = 0;
    struct uring_stats *stats = bpf_map_lookup_elem(&uring_stats, &zero);
    if (!stats)
        return 0;
    __u32 bucket = 0;
    for (int i = 0; i < LATENCY_BUCKETS - 1; i++) {
        if (us >> 1 == 0)
            break;
        us >>= 1;
        bucket++;
    }
    __sync_fetch_and_add(&stats->requests, 1);
    if (args->res < 0)
        __sync_fetch_and_add(&stats->errors, 1);
    if (bucket < LATENCY_BUCKETS)
        __sync_fetch_and_add(&stats->latency_log2_us[bucket], 1);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
