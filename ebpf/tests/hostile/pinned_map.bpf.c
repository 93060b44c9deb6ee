// SPDX-License-Identifier: GPL-2.0
/* Hostile: a policy whose state map is pinned by name (it would outlive
 * the node in bpffs and could be opened by anyone who can reach it). */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>

#include "sluice_steer.h"

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, SLUICE_FLOWS_MAX);
    __uint(pinning, LIBBPF_PIN_BY_NAME);
    __type(key, __u32);
    __type(value, __u64);
} flow_states SEC(".maps");

SEC("uprobe")
int lane_policy(struct pt_regs *ctx)
{
    struct sluice_batch_probe p;
    if (bpf_probe_read_user(&p, sizeof(p), (const void *)ctx->rdi))
        return 0;
    __u32 flow = p.flow;
    __u64 *seen = bpf_map_lookup_elem(&flow_states, &flow);
    if (seen)
        *seen += 1;
    sluice_decide(&p, SLUICE_DECISION_BULK);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
