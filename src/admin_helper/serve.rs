//! The helper process itself: started by the node (as root, before it
//! drops to `--user`) from its own executable, it keeps `CAP_SYS_ADMIN`
//! and nothing else, runs one thread, and answers the node's requests on
//! the socket it was given as standard input until the node closes it
//! (exits, or is killed).
//!
//! It runs only the commands of [`super::proto::Request`], and only on the
//! controllers named on its command line; it never attaches a namespace
//! shared with other controllers, and opens no path but the block device
//! sysfs names for a namespace of one of those controllers.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::PathBuf;
use std::process::ExitCode;

use sluice_control::claim::HeldDevice;
use sluice_control::nvme::{KernelAdmin, Passthrough};

use super::proto::{decode, encode, Reply, Request, MESSAGE_BYTES_MAX};
use super::{receive, send};

/// The first argument that makes the executable the helper.
pub const HELPER_FLAG: &str = "--nvme-admin-helper";

/// Runs the helper when the process was started as one (`HELPER_FLAG`
/// first), before anything else in `main` (the helper is one thread);
/// `None` for every other start.
pub fn serve_if_asked() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(HELPER_FLAG)) {
        return None;
    }
    let controllers: Vec<PathBuf> = args.map(PathBuf::from).collect();
    Some(match run(&controllers) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sluice nvme admin helper: {err}");
            ExitCode::FAILURE
        }
    })
}

fn run(controllers: &[PathBuf]) -> Result<(), String> {
    let stdin = io::stdin();
    let socket = stdin.as_fd();
    let kind = nix::sys::socket::getsockopt(&socket, nix::sys::socket::sockopt::SockType)
        .map_err(|e| format!("standard input is not the node's socket ({e}): the node starts the helper itself"))?;
    if kind != nix::sys::socket::SockType::SeqPacket {
        return Err("standard input is not a SOCK_SEQPACKET socket: the node starts the helper itself".into());
    }
    if controllers.is_empty() || controllers.len() > usize::from(u16::MAX) {
        return Err(format!("{} controllers given; the node gives one or more", controllers.len()));
    }
    keep_only_sys_admin()?;
    serve(socket, &Passthrough::new(controllers.to_vec()))
}

/// Leaves this process `CAP_SYS_ADMIN` (NVMe admin passthrough and
/// rescan need it) and no other capability, with nothing it runs able to
/// gain one. Root still owns the device nodes, so it opens them without
/// `CAP_DAC_OVERRIDE`.
fn keep_only_sys_admin() -> Result<(), String> {
    use caps::{CapSet, Capability, CapsHashSet};
    let keep: CapsHashSet = [Capability::CAP_SYS_ADMIN].into_iter().collect();
    crate::privilege::drop_bounding_set_except(&[Capability::CAP_SYS_ADMIN.index()])?;
    caps::clear(None, CapSet::Ambient).map_err(|e| format!("clearing ambient capabilities: {e}"))?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| format!("clearing inheritable capabilities: {e}"))?;
    caps::set(None, CapSet::Effective, &keep).map_err(|e| format!("setting effective capabilities: {e}"))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(|e| format!("setting permitted capabilities: {e}"))?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("prctl(PR_SET_NO_NEW_PRIVS): {e}"))?;
    let held = caps::read(None, CapSet::Permitted).map_err(|e| format!("reading capabilities: {e}"))?;
    if held != keep {
        return Err(format!("capabilities left after the drop: {held:?}"));
    }
    Ok(())
}

/// Answers requests on `socket` until the other end closes it.
pub fn serve(socket: BorrowedFd<'_>, admin: &dyn KernelAdmin) -> Result<(), String> {
    let mut buf = vec![0u8; MESSAGE_BYTES_MAX];
    loop {
        let (reply, held) = match receive(socket, &mut buf) {
            Ok((0, _)) => return Ok(()),
            Ok((n, _)) => match decode::<Request>(&buf[..n]) {
                Ok(request) => answer(&request, admin),
                Err(err) => (Reply::Failed(err.to_string()), None),
            },
            Err(err) if err.kind() == io::ErrorKind::InvalidData => (Reply::Failed(err.to_string()), None),
            Err(err) => return Err(format!("reading a request: {err}")),
        };
        let bytes = encode(&reply).or_else(|e| encode(&Reply::Failed(e.to_string()))).map_err(|e| e.to_string())?;
        let fds = held.as_ref().map(|h| [h.control.as_raw_fd(), h.direct.as_raw_fd()]);
        send(socket, &bytes, fds.as_ref().map_or(&[][..], |f| &f[..])).map_err(|e| format!("replying: {e}"))?;
        // The descriptors went across; ours close here.
        drop(held);
    }
}

/// One request's reply, and the device it opened if it opened one.
/// A request names a controller by its index among `admin`'s, the ones
/// the helper was started with.
pub fn answer(request: &Request, admin: &dyn KernelAdmin) -> (Reply, Option<HeldDevice>) {
    let Some(index) = request.controller() else { return (Reply::Done, None) };
    let controllers = admin.controllers();
    let Some(controller) = controllers.get(usize::from(index)) else {
        let why = format!("controller {index} is not one of the {} the helper was started with", controllers.len());
        return (Reply::Failed(why), None);
    };
    let controller = controller.as_str();
    let failed = |err: io::Error| Reply::Failed(format!("{controller}: {err}"));
    let reply = |result: io::Result<Reply>| (result.unwrap_or_else(failed), None);
    match *request {
        Request::Ping => (Reply::Done, None),
        Request::ManagesNamespaces { .. } => reply(admin.manages_namespaces(controller).map(Reply::Flag)),
        Request::Create { bytes, .. } => {
            eprintln!("sluice nvme admin helper: creating a namespace of {bytes} bytes on {controller}");
            reply(admin.create(controller, bytes).map(Reply::Nsid))
        }
        Request::Delete { nsid, .. } => {
            eprintln!("sluice nvme admin helper: deleting namespace {nsid} of {controller}");
            reply(admin.delete(controller, nsid).map(|()| Reply::Done))
        }
        Request::Namespaces { .. } => reply(admin.namespaces(controller).map(Reply::Namespaces)),
        Request::Identity { nsid, .. } => reply(admin.namespace_identity(controller, nsid).map(Reply::Identity)),
        Request::Attach { nsid, .. } => match unshared(admin, controller, nsid) {
            Ok(()) => {
                eprintln!("sluice nvme admin helper: attaching namespace {nsid} of {controller}");
                reply(admin.attach(controller, nsid).map(|()| Reply::Done))
            }
            Err(err) => (Reply::Failed(err), None),
        },
        Request::Detach { nsid, .. } => {
            eprintln!("sluice nvme admin helper: detaching namespace {nsid} of {controller}");
            reply(admin.detach(controller, nsid).map(|()| Reply::Done))
        }
        Request::Open { nsid, .. } => match admin.open_namespace(controller, nsid) {
            Ok(held) => {
                let opened = Reply::Opened { path: held.path.clone(), capacity_bytes: held.capacity_bytes };
                (opened, Some(held))
            }
            Err(err) => (failed(err), None),
        },
    }
}

/// Refuses a namespace another controller may attach too (NMIC), whatever
/// the node asks: another host may write it.
fn unshared(admin: &dyn KernelAdmin, controller: &str, nsid: u32) -> Result<(), String> {
    let namespaces = admin.namespaces(controller).map_err(|e| format!("{controller}: {e}"))?;
    match namespaces.iter().find(|ns| ns.nsid == nsid) {
        None => Err(format!("{controller} has no namespace {nsid}")),
        Some(ns) if ns.shared => {
            Err(format!("namespace {nsid} of {controller} is shared with other controllers (NMIC): never attached"))
        }
        Some(_) => Ok(()),
    }
}
