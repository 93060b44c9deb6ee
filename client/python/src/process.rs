//! Native objects that belong to the process that made them.
//!
//! A forked child (a PyTorch DataLoader worker, by default on Linux) gets
//! a copy of its parent's memory but none of its threads: the tokio runtime
//! behind a client is a scheduler whose workers are gone and whose locks
//! may be held by threads that no longer exist. Using it hangs; so does
//! dropping it, because dropping a runtime or a task handle waits on those
//! threads. [`ProcessLocal`] remembers the process that made its value and
//! refuses it to any other with a clear error; in another process it is
//! leaked, never dropped. The Python package then connects afresh in the
//! child.

use pyo3::PyErr;

use crate::errors::Forked;

/// A value usable only in the process that made it (see the module docs).
pub struct ProcessLocal<T> {
    pid: u32,
    value: Option<T>,
}

impl<T> ProcessLocal<T> {
    pub fn new(value: T) -> Self {
        Self { pid: std::process::id(), value: Some(value) }
    }

    fn here(&self) -> bool {
        self.pid == std::process::id()
    }

    /// The value, in the process that made it.
    pub fn get(&self) -> Result<&T, PyErr> {
        match &self.value {
            Some(value) if self.here() => Ok(value),
            _ => Err(self.forked()),
        }
    }

    pub fn get_mut(&mut self) -> Result<&mut T, PyErr> {
        if !self.here() {
            return Err(self.forked());
        }
        self.value.as_mut().ok_or_else(|| Forked::new_err("closed"))
    }

    fn forked(&self) -> PyErr {
        Forked::new_err(format!(
            "this sluice object was made in process {} and this is process {} (a fork): connect again here \
             (sluice.torch datasets do so in each DataLoader worker)",
            self.pid,
            std::process::id()
        ))
    }
}

impl<T> Drop for ProcessLocal<T> {
    fn drop(&mut self) {
        if !self.here() {
            // Dropping the parent's runtime or tasks here would wait on
            // threads this process does not have.
            std::mem::forget(self.value.take());
        }
    }
}
