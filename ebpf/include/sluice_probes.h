/* The probe ABI of the sluice data plane: the structs its probe functions
 * (sluice_probe_lane_select, sluice_probe_batch_submit,
 * sluice_probe_batch_complete) pass by pointer,
 * for BPF programs attached to them as uprobes. The Rust side is
 * dataplane/src/probe.rs; a test fails if the two layouts differ. */
#ifndef SLUICE_PROBES_H
#define SLUICE_PROBES_H

#ifdef __BPF__
typedef unsigned char __u8;
typedef unsigned int __u32;
typedef unsigned long long __u64;
#else
#include <stdint.h>
typedef uint8_t __u8;
typedef uint32_t __u32;
typedef uint64_t __u64;
#endif

/* log2 buckets of range sizes: bucket b counts ranges of [2^b, 2^(b+1))
 * bytes; the last bucket takes everything larger. */
#define SLUICE_SIZE_BUCKETS 24

#define SLUICE_LANE_LATENCY 0
#define SLUICE_LANE_BULK 1

#define SLUICE_LANE_BY_THRESHOLD 0
#define SLUICE_LANE_BY_POLICY 1

/* Steering: a flow is one dataset opened on one connection. A policy
 * writes one __u32 decision per flow into an mmapped array of
 * SLUICE_FLOWS_MAX entries, which the data plane reads per batch. */
#define SLUICE_FLOWS_MAX 4096
#define SLUICE_FLOW_UNSTEERED 0xffffffffu
#define SLUICE_DECISION_NONE 0
#define SLUICE_DECISION_LATENCY 1
#define SLUICE_DECISION_BULK 2

struct sluice_batch_probe {
    __u64 dataset_id;      /* catalog id of the dataset */
    __u32 client_id;       /* connection number on this node */
    __u8 lane;             /* SLUICE_LANE_* */
    __u8 lane_source;      /* SLUICE_LANE_BY_*: what chose the lane */
    __u8 pad[2];
    __u32 ranges;          /* ranges in the batch */
    __u32 failed_ranges;   /* ranges that did not read back ok (complete) */
    __u64 bytes;           /* bytes the batch asked for */
    __u64 submit_ns;       /* CLOCK_MONOTONIC when the core admitted it */
    __u64 complete_ns;     /* CLOCK_MONOTONIC when it completed; 0 at submit */
    __u32 size_hist[SLUICE_SIZE_BUCKETS];
    __u32 flow;            /* index into the decision array, or SLUICE_FLOW_UNSTEERED */
    __u32 flow_generation; /* tells a reused flow index from its last holder */
    __u8 peer[16];         /* peer address, IPv6 or IPv4-mapped */
};

#endif
