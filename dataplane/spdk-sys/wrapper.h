/* What sluice uses of SPDK: the env (DPDK), the NVMe driver, DMA memory. */
#include <spdk/stdinc.h>
#include <spdk/env.h>
#include <spdk/nvme.h>
#include <spdk/nvme_spec.h>
