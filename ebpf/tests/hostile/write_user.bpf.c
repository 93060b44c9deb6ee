// SPDX-License-Identifier: GPL-2.0
/* Hostile: a uprobe policy that writes the node's memory. */
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
    __u32 zero = 0;
    bpf_probe_write_user((void *)ctx->rdi, &zero, sizeof(zero));
    sluice_decide(&p, SLUICE_DECISION_BULK);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
