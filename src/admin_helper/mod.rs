//! Privilege separation for NVMe controllers (as OpenSSH's monitor does it
//! for sshd): a node that drops to `--user` and still attaches, detaches,
//! creates and deletes namespaces of its `nvme_controllers` leaves those
//! commands to a helper process it starts while it is root. The helper
//! keeps `CAP_SYS_ADMIN` alone ([`serve`]); the node keeps nothing, and
//! reaches the helper through [`AdminHelper`], a [`KernelAdmin`] like the
//! in-process [`sluice_control::nvme::Passthrough`]. A namespace attached
//! at run time is a new root-only device node: the helper opens it and
//! passes the descriptors back over the socket (`SCM_RIGHTS`).
//!
//! What a compromised node can make the helper do is bounded by the
//! config it was started with: admin commands on the configured
//! controllers' unshared namespaces, and opening their block devices.

pub mod proto;
pub mod serve;

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType};
use sluice_control::claim::HeldDevice;
use sluice_control::nvme::KernelAdmin;
use sluice_dataplane::{NvmeAdmin, NvmeNamespace};

use proto::{decode, encode, Reply, Request, DESCRIPTORS_MAX, MESSAGE_BYTES_MAX};
pub use serve::{serve_if_asked, HELPER_FLAG};

/// Longest a command may take in the helper: an attach waits up to 5 s for
/// its block device; a controller that never answers fails the call
/// rather than hang the node.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the node waits for the helper to exit once it closed the socket.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// The node's end of the helper.
pub struct AdminHelper {
    controllers: Vec<PathBuf>,
    link: Mutex<Link>,
}

struct Link {
    socket: Option<OwnedFd>,
    /// The helper process (none where the tests serve on a thread).
    child: Option<Child>,
    buf: Vec<u8>,
}

impl AdminHelper {
    /// Starts the helper for `controllers` from this process's own
    /// executable and waits until it serves. The caller is root.
    pub fn spawn(controllers: &[PathBuf]) -> Result<Self, String> {
        let (ours, theirs) =
            socket::socketpair(socket::AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                .map_err(|e| format!("socketpair: {e}"))?;
        let timeout = nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as _, 0);
        socket::setsockopt(&ours, socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| format!("setting the helper's reply timeout: {e}"))?;
        // /proc/self/exe is this very binary even when the file was
        // replaced on disk since the node started.
        let child = Command::new("/proc/self/exe")
            .arg(HELPER_FLAG)
            .args(controllers)
            .env_clear()
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the NVMe admin helper: {e}"))?;
        let helper = Self {
            controllers: controllers.to_vec(),
            link: Mutex::new(Link { socket: Some(ours), child: Some(child), buf: vec![0u8; MESSAGE_BYTES_MAX] }),
        };
        match helper.call(&Request::Ping) {
            Ok((Reply::Done, _)) => {
                tracing::info!("NVMe admin helper up for {} controllers", controllers.len());
                Ok(helper)
            }
            Ok((other, _)) => Err(format!("the NVMe admin helper answered {other:?} to a ping")),
            Err(err) => Err(format!("the NVMe admin helper did not start (its reason is in the log above): {err}")),
        }
    }

    /// The node's end of a helper served some other way (tests).
    #[cfg(test)]
    fn over(socket: OwnedFd, controllers: Vec<PathBuf>) -> Self {
        let link = Link { socket: Some(socket), child: None, buf: vec![0u8; MESSAGE_BYTES_MAX] };
        Self { controllers, link: Mutex::new(link) }
    }

    fn index(&self, controller: &str) -> io::Result<u16> {
        let index = self.controllers.iter().position(|c| c.as_os_str() == controller).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{controller} is not one of the controllers the helper serves"),
            )
        })?;
        u16::try_from(index).map_err(|_| io::Error::other("too many controllers"))
    }

    /// Sends `request` and waits for its reply (one at a time: the lock
    /// pairs each request with its reply). A send or receive that fails,
    /// or a reply that does not come in time, closes the link for good:
    /// a late reply would otherwise answer the next request.
    fn call(&self, request: &Request) -> io::Result<(Reply, Vec<OwnedFd>)> {
        let bytes = encode(request).map_err(io::Error::other)?;
        let mut link = self.link.lock().map_err(|_| io::Error::other("the helper's lock is poisoned"))?;
        let Link { socket, buf, .. } = &mut *link;
        let open = socket.as_ref().ok_or_else(|| io::Error::other("the helper is stopped"))?;
        let exchanged = send(open.as_fd(), &bytes, &[]).and_then(|()| receive(open.as_fd(), buf));
        let (n, fds) = match exchanged {
            Ok((0, _)) => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            other => other,
        }
        .inspect_err(|_| drop(socket.take()))
        .map_err(gone)?;
        let reply = decode::<Reply>(&buf[..n]).map_err(io::Error::other)?;
        Ok((reply, fds))
    }

    /// Asks about `controller`, expecting a reply `accept` takes (it hands
    /// back any other).
    fn ask<T>(
        &self,
        controller: &str,
        request: impl FnOnce(u16) -> Request,
        accept: impl FnOnce(Reply, Vec<OwnedFd>) -> Result<T, Reply>,
    ) -> io::Result<T> {
        let (reply, fds) = self.call(&request(self.index(controller)?))?;
        match reply {
            Reply::Failed(why) => Err(io::Error::other(why)),
            other => accept(other, fds)
                .map_err(|unexpected| io::Error::other(format!("unexpected reply from the helper: {unexpected:?}"))),
        }
    }
}

fn gone(err: io::Error) -> io::Error {
    io::Error::new(err.kind(), format!("the NVMe admin helper is gone or stuck: {err}"))
}

impl NvmeAdmin for AdminHelper {
    fn controllers(&self) -> Vec<String> {
        self.controllers.iter().map(|c| c.display().to_string()).collect()
    }

    fn manages_namespaces(&self, controller: &str) -> io::Result<bool> {
        self.ask(
            controller,
            |controller| Request::ManagesNamespaces { controller },
            |r, _| match r {
                Reply::Flag(flag) => Ok(flag),
                other => Err(other),
            },
        )
    }

    fn create(&self, controller: &str, bytes: u64) -> io::Result<u32> {
        self.ask(
            controller,
            |controller| Request::Create { controller, bytes },
            |r, _| match r {
                Reply::Nsid(nsid) => Ok(nsid),
                other => Err(other),
            },
        )
    }

    fn delete(&self, controller: &str, nsid: u32) -> io::Result<()> {
        self.ask(
            controller,
            |controller| Request::Delete { controller, nsid },
            |r, _| if r == Reply::Done { Ok(()) } else { Err(r) },
        )
    }

    fn namespaces(&self, controller: &str) -> io::Result<Vec<NvmeNamespace>> {
        self.ask(
            controller,
            |controller| Request::Namespaces { controller },
            |r, _| match r {
                Reply::Namespaces(list) => Ok(list),
                other => Err(other),
            },
        )
    }

    fn namespace_identity(&self, controller: &str, nsid: u32) -> io::Result<String> {
        self.ask(
            controller,
            |controller| Request::Identity { controller, nsid },
            |r, _| match r {
                Reply::Identity(identity) => Ok(identity),
                other => Err(other),
            },
        )
    }

    fn attach(&self, controller: &str, nsid: u32) -> io::Result<()> {
        self.ask(
            controller,
            |controller| Request::Attach { controller, nsid },
            |r, _| if r == Reply::Done { Ok(()) } else { Err(r) },
        )
    }

    fn detach(&self, controller: &str, nsid: u32) -> io::Result<()> {
        self.ask(
            controller,
            |controller| Request::Detach { controller, nsid },
            |r, _| if r == Reply::Done { Ok(()) } else { Err(r) },
        )
    }
}

impl KernelAdmin for AdminHelper {
    fn open_namespace(&self, controller: &str, nsid: u32) -> io::Result<HeldDevice> {
        self.ask(
            controller,
            |controller| Request::Open { controller, nsid },
            |r, fds| match (r, <[OwnedFd; 2]>::try_from(fds)) {
                (Reply::Opened { path, capacity_bytes }, Ok([control, direct])) => Ok(HeldDevice {
                    path,
                    control: Arc::new(control.into()),
                    direct: Arc::new(direct.into()),
                    capacity_bytes,
                }),
                (other, _) => Err(other),
            },
        )
    }
}

impl Drop for AdminHelper {
    /// Closing the socket ends the helper; one that does not end in time
    /// is killed, so no root process outlives the node.
    fn drop(&mut self) {
        let Ok(link) = self.link.get_mut() else { return };
        drop(link.socket.take());
        let Some(child) = link.child.as_mut() else { return };
        let deadline = Instant::now() + EXIT_WAIT;
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Sends one datagram, with `fds` beside it when there are any.
fn send(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    assert!(fds.len() <= DESCRIPTORS_MAX);
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    let sent = socket::sendmsg::<()>(socket.as_raw_fd(), &[IoSlice::new(bytes)], cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if sent != bytes.len() {
        return Err(io::Error::other(format!("sent {sent} of {} bytes", bytes.len())));
    }
    Ok(())
}

/// Receives one datagram into `buf` (0 bytes: the other end closed) and
/// the descriptors that came with it, close-on-exec. A datagram or a set
/// of descriptors too large to take whole is `InvalidData`, and what came
/// of it is dropped.
fn receive(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; DESCRIPTORS_MAX]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = loop {
        match socket::recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other?,
        }
    };
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            for fd in received {
                // SAFETY: the kernel installed `fd` in this process's table
                // for this message just now; nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    if msg.flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "a message over the size limit, dropped"));
    }
    if fds.len() > DESCRIPTORS_MAX {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "more descriptors than a reply carries, dropped"));
    }
    Ok((msg.bytes, fds))
}

#[cfg(test)]
mod tests;
