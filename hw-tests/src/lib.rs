//! The hardware-in-the-loop rig: QEMU microVMs with emulated NVMe
//! controllers, a virtual IOMMU and soft-RoCE, and the tests that run sluice
//! against them (or against real devices named by `SLUICE_HW_NVME` and
//! `SLUICE_HW_RDMA`).
//!
//! Nothing is implemented here yet: the crate holds no tests.
