//! The hardware-in-the-loop rig: QEMU guests with emulated NVMe controllers,
//! a virtual IOMMU and soft-RoCE, joined by a virtual wire, and the tests
//! that run sluice against them. With `SLUICE_HW_NVME` / `SLUICE_HW_RDMA`
//! set, the same tests run on this machine's real devices instead.
//!
//! ```no_run
//! use hw_tests::{Host, Rig};
//! let rig = Rig::builder("doc").hosts(2).nvme(1, 2).detached(1).rdma(true).boot()?;
//! let out = rig.exec(Host::Storage, "nvme list")?;
//! # Ok::<(), hw_tests::RigError>(())
//! ```

mod cargo;
mod guest;
mod initramfs;
mod kernel;
mod prereq;
mod rig;
mod tls;

pub use cargo::cargo;
pub use prereq::{require, Missing};
pub use rig::{
    Host, NvmeController, Rig, RigBuilder, RigError, RigOutput, GUEST_PYTHON, SLUICE_CONTROL_PORT, SLUICE_DATA_PORT,
};
pub use tls::RigTls;
