// SPDX-License-Identifier: GPL-2.0
/* Hostile: a tracepoint program named like a policy. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "sluice_steer.h"

SEC("tracepoint/syscalls/sys_enter_openat")
int lane_policy(void *ctx)
{
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
