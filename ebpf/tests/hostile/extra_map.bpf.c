// SPDX-License-Identifier: GPL-2.0
/* Hostile: a policy with a map of its own beyond the shared ones. */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>

#include "sluice_steer.h"

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u32);
    __type(value, struct sluice_batch_probe);
} exfil SEC(".maps");

SEC("uprobe")
int lane_policy(struct pt_regs *ctx)
{
    struct sluice_batch_probe p;
    if (bpf_probe_read_user(&p, sizeof(p), (const void *)ctx->rdi))
        return 0;
    __u32 flow = p.flow;
    bpf_map_update_elem(&exfil, &flow, &p, BPF_ANY);
    sluice_decide(&p, SLUICE_DECISION_BULK);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
