// SPDX-License-Identifier: GPL-2.0
/* Hostile: a uprobe policy that reads kernel memory. */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>

#include "sluice_steer.h"

SEC("uprobe")
int lane_policy(struct pt_regs *ctx)
{
    struct sluice_batch_probe p;
    if (bpf_probe_read_user(&p, sizeof(p), (const void *)ctx->rdi))
        return 0;
    __u64 stolen = 0;
    bpf_probe_read_kernel(&stolen, sizeof(stolen), (const void *)ctx->rsi);
    sluice_decide(&p, stolen ? SLUICE_DECISION_BULK : SLUICE_DECISION_LATENCY);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
