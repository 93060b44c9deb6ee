//! The SPDK backend: SPDK's user-space NVMe driver owns the controllers
//! (bound to vfio-pci), each core gets one I/O queue pair per controller and
//! polls it for completions, and reads land straight in the core's DMA
//! arena, which is registered with SPDK (and, on RDMA nodes, with the NIC:
//! one arena, both registrations).
//!
//! One job a file: [`env`] starts SPDK's env and holds its DMA memory,
//! [`controller`] attaches controllers and owns them, [`admin`] is namespace
//! management over them ([`NvmeAdmin`]), [`control`] a namespace's
//! synchronous control path (ingest, seal, copies), [`queue`] a core's hot
//! path. Every call into SPDK goes through `sys`; under `cfg(test)` the
//! in-memory `fake` stands in for it, so all of the above has unit tests
//! (`tests.rs`) on machines without SPDK or an NVMe device.

mod admin;
mod control;
mod controller;
mod env;
mod queue;
#[cfg(not(test))]
mod sys;
#[cfg(test)]
#[path = "fake.rs"]
mod sys;
#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use control::SpdkTarget;
pub use controller::SpdkDriver;
pub use queue::SpdkQueue;

use super::{BlockDriver, DriverError, DriverKind, Namespace, NamespaceSpec, NvmeAdmin, Queue};
use crate::dma::Arena;

/// Which way a command moves sectors between a namespace and memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Read,
    Write,
}

/// A run of whole sectors of a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sectors {
    lba: u64,
    count: u32,
}

/// Namespaces and queues hold the driver, so the controllers stay attached
/// while any of them lives.
impl BlockDriver for Arc<SpdkDriver> {
    fn kind(&self) -> DriverKind {
        DriverKind::Spdk
    }

    fn open_namespace(&self, spec: &NamespaceSpec) -> Result<Arc<dyn Namespace>, DriverError> {
        let NamespaceSpec::Nvme { controller, nsid } = spec else {
            return Err(DriverError::WrongSpec(spec.clone(), DriverKind::Spdk));
        };
        Ok(Arc::new(control::SpdkNamespace::open(self, controller, *nsid)?))
    }

    fn create_queue(&self, arena: &Arena, depth: u32) -> Result<Queue, DriverError> {
        if !arena.is_hugepage_backed() {
            return Err(DriverError::Spdk(
                "the SPDK driver needs each core's DMA arena in hugepages: reserve them (vm.nr_hugepages)".into(),
            ));
        }
        SpdkQueue::new(Arc::clone(self), arena, depth).map(Queue::Spdk)
    }

    fn nvme_admin(&self) -> Option<&dyn NvmeAdmin> {
        Some(&**self)
    }
}
