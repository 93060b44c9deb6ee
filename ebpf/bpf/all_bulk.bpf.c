// SPDX-License-Identifier: GPL-2.0
/* A steering policy that puts every flow it sees in the bulk lane: for
 * draining the latency lane during maintenance, and the smallest example
 * of a policy (`sluicectl policy load ebpf/bpf/all_bulk.bpf.o`). */
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
    sluice_decide(&p, SLUICE_DECISION_BULK);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
