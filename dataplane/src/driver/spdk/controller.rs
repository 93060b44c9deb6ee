//! The controllers SPDK attached for this node, named by PCI address, and
//! their teardown: a controller is detached when the driver drops, which is
//! after every namespace and queue that used it (they hold the driver).

use std::io;
use std::sync::Mutex;

use super::env::start_env;
use super::sys;
use crate::driver::DriverError;

/// A controller SPDK attached.
pub(super) struct Controller {
    pub(super) pci: String,
    pub(super) ctrlr: sys::Ctrlr,
    /// Admin commands and the control path's queue pairs are made one at a
    /// time per controller.
    pub(super) admin: Mutex<()>,
}

/// SPDK's NVMe driver on the controllers at the PCI addresses given.
pub struct SpdkDriver {
    pub(super) controllers: Vec<Controller>,
}

// SAFETY: SPDK controller handles may be used from any thread for admin
// commands (SPDK serialises them with the controller's own lock, and this
// driver also holds `admin`); I/O queue pairs are never shared: each belongs
// to one core's `SpdkQueue` or one namespace's control path under a mutex.
unsafe impl Send for SpdkDriver {}
// SAFETY: as above.
unsafe impl Sync for SpdkDriver {}

impl SpdkDriver {
    /// Starts SPDK's env and attaches the NVMe controllers at `pci`
    /// (`0000:00:05.0`), which must be bound to vfio-pci (or uio).
    pub fn start(pci: &[String]) -> Result<Self, DriverError> {
        if pci.is_empty() {
            return Err(DriverError::Spdk("no NVMe controller given (--nvme PCI_ADDRESS,...)".into()));
        }
        start_env("sluiced")?;
        let mut driver = Self { controllers: Vec::with_capacity(pci.len()) };
        for address in pci {
            if driver.controllers.iter().any(|c| &c.pci == address) {
                return Err(DriverError::Spdk(format!("NVMe controller {address} given twice")));
            }
            // On error, `driver` drops and detaches those attached so far.
            let ctrlr = sys::probe(address).map_err(DriverError::Spdk)?;
            tracing::info!("SPDK attached the NVMe controller at {address}");
            driver.controllers.push(Controller { pci: address.clone(), ctrlr, admin: Mutex::new(()) });
        }
        Ok(driver)
    }

    pub(super) fn controller(&self, pci: &str) -> io::Result<&Controller> {
        self.controller_index(pci).map(|index| &self.controllers[index])
    }

    pub(super) fn controller_index(&self, pci: &str) -> io::Result<usize> {
        self.controllers
            .iter()
            .position(|c| c.pci == pci)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no SPDK controller at {pci}")))
    }
}

impl Drop for SpdkDriver {
    fn drop(&mut self) {
        for controller in &self.controllers {
            // SAFETY: every queue pair of this controller was freed with the
            // queues and namespaces that held it (they hold the driver).
            let rc = unsafe { sys::detach(controller.ctrlr) };
            if rc != 0 {
                tracing::warn!("SPDK detach of {} returned {rc}", controller.pci);
            } else {
                tracing::info!("SPDK detached the NVMe controller at {}", controller.pci);
            }
        }
    }
}
