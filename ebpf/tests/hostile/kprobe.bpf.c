// SPDX-License-Identifier: GPL-2.0
/* Hostile: a kprobe named like a policy. */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>

#include "sluice_steer.h"

SEC("kprobe/do_nanosleep")
int lane_policy(struct pt_regs *ctx)
{
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
