//! The helper's serving loop against a stand-in for the controllers (the
//! rig runs it against QEMU's), over a real socket pair with real
//! descriptor passing.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

/// Namespace 1 (a file standing in for its block device) and namespace 2,
/// shared with another controller.
struct Stand {
    device: PathBuf,
    attaches: AtomicU32,
}

impl NvmeAdmin for Stand {
    fn controllers(&self) -> Vec<String> {
        vec![CONTROLLER.into()]
    }
    fn manages_namespaces(&self, _: &str) -> io::Result<bool> {
        Ok(false)
    }
    fn create(&self, _: &str, _: u64) -> io::Result<u32> {
        Err(io::Error::other("NVMe status 0x2"))
    }
    fn delete(&self, _: &str, _: u32) -> io::Result<()> {
        Ok(())
    }
    fn namespaces(&self, _: &str) -> io::Result<Vec<NvmeNamespace>> {
        Ok(vec![
            NvmeNamespace { nsid: 1, attached: false, capacity_bytes: 4096, shared: false },
            NvmeNamespace { nsid: 2, attached: false, capacity_bytes: 4096, shared: true },
        ])
    }
    fn namespace_identity(&self, _: &str, nsid: u32) -> io::Result<String> {
        if nsid == SLOW_NSID {
            std::thread::sleep(std::time::Duration::from_millis(400));
        }
        Ok(format!("id-{nsid}"))
    }
    fn attach(&self, _: &str, _: u32) -> io::Result<()> {
        self.attaches.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn detach(&self, _: &str, _: u32) -> io::Result<()> {
        Ok(())
    }
}

impl KernelAdmin for Stand {
    fn open_namespace(&self, _: &str, nsid: u32) -> io::Result<HeldDevice> {
        if nsid != 1 {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("namespace {nsid} is not attached")));
        }
        let open = || std::fs::OpenOptions::new().read(true).write(true).open(&self.device);
        Ok(HeldDevice {
            path: self.device.clone(),
            control: Arc::new(open()?),
            direct: Arc::new(open()?),
            capacity_bytes: 4096,
        })
    }
}

const CONTROLLER: &str = "/dev/nvme-stand-in";
/// A namespace whose identify outlasts the node's patience.
const SLOW_NSID: u32 = 9;

/// A helper serving `stand` on a thread, and the node's end of it.
fn helper(stand: Arc<Stand>) -> (AdminHelper, std::thread::JoinHandle<Result<(), String>>) {
    let (ours, theirs) =
        socket::socketpair(socket::AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .expect("socketpair");
    let thread = std::thread::spawn(move || serve::serve(theirs.as_fd(), &*stand));
    (AdminHelper::over(ours, vec![PathBuf::from(CONTROLLER)]), thread)
}

fn stand() -> (tempfile::TempDir, Arc<Stand>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let device = dir.path().join("nvme0n1");
    std::fs::write(&device, (0..4096u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>()).expect("device");
    (dir, Arc::new(Stand { device, attaches: AtomicU32::new(0) }))
}

/// The descriptors the helper opened arrive, and read the device.
#[test]
fn an_opened_namespace_comes_back_as_descriptors() {
    let (_dir, stand) = stand();
    let (helper, thread) = helper(Arc::clone(&stand));
    let held = helper.open_namespace(CONTROLLER, 1).expect("open");
    assert_eq!(held.path, stand.device);
    assert_eq!(held.capacity_bytes, 4096);
    let mut head = [0u8; 16];
    held.direct.read_exact_at(&mut head, 251).expect("read");
    assert_eq!(head, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
    held.control.write_all_at(b"written", 0).expect("write through the control descriptor");
    let mut start = [0u8; 7];
    File::open(&stand.device).expect("reopen").read_exact(&mut start).expect("read");
    assert_eq!(&start, b"written");
    let err = helper.open_namespace(CONTROLLER, 3).expect_err("not attached");
    assert!(err.to_string().contains("namespace 3 is not attached"), "{err}");
    drop(helper);
    thread.join().expect("join").expect("the helper ends when the node closes its end");
}

/// The node can name only the helper's controllers; a raw request naming
/// another index is refused by the helper itself.
#[test]
fn only_the_configured_controllers_are_served() {
    let (_dir, stand) = stand();
    let (helper, _thread) = helper(stand);
    let err = helper.namespaces("/dev/nvme9").expect_err("not configured");
    assert!(err.to_string().contains("not one of the controllers"), "{err}");
    let (reply, _) = helper.call(&Request::Detach { controller: 1, nsid: 1 }).expect("call");
    assert_eq!(reply, Reply::Failed("controller 1 is not one of the 1 the helper was started with".into()));
}

/// A shared namespace is refused by the helper whatever the node asks.
#[test]
fn the_helper_never_attaches_a_shared_namespace() {
    let (_dir, stand) = stand();
    let (helper, _thread) = helper(Arc::clone(&stand));
    let err = helper.attach(CONTROLLER, 2).expect_err("shared");
    assert!(err.to_string().contains("shared with other controllers"), "{err}");
    assert_eq!(stand.attaches.load(Ordering::SeqCst), 0);
    helper.attach(CONTROLLER, 1).expect("attach");
    assert_eq!(stand.attaches.load(Ordering::SeqCst), 1);
    let err = helper.create(CONTROLLER, 1 << 20).expect_err("refused");
    assert!(err.to_string().contains("NVMe status 0x2"), "{err}");
}

/// Garbage gets an error reply and the helper goes on serving.
#[test]
fn a_malformed_request_is_answered_and_survived() {
    let (_dir, stand) = stand();
    let (helper, _thread) = helper(stand);
    {
        let mut link = helper.link.lock().expect("lock");
        let Link { socket, buf, .. } = &mut *link;
        let socket = socket.as_ref().expect("socket");
        send(socket.as_fd(), b"{\"Open\":", &[]).expect("send");
        let (n, fds) = receive(socket.as_fd(), buf).expect("reply");
        assert!(fds.is_empty());
        let reply: Reply = decode(&buf[..n]).expect("decode");
        assert!(matches!(&reply, Reply::Failed(why) if why.contains("malformed")), "{reply:?}");
    }
    assert_eq!(helper.namespace_identity(CONTROLLER, 1).expect("identity"), "id-1");
}

/// A helper that is gone fails each call at once, never hangs.
#[test]
fn a_gone_helper_is_an_error() {
    let (ours, theirs) =
        socket::socketpair(socket::AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .expect("socketpair");
    drop(theirs);
    let helper = AdminHelper::over(ours, vec![PathBuf::from(CONTROLLER)]);
    let err = helper.namespaces(CONTROLLER).expect_err("gone");
    assert!(err.to_string().contains("the NVMe admin helper is gone"), "{err}");
}

/// A reply that comes too late must never answer the next request: the
/// node gives the helper up instead of reading replies one behind.
#[test]
fn a_late_reply_never_answers_the_next_request() {
    let (_dir, stand) = stand();
    let (helper, _thread) = helper(stand);
    {
        let link = helper.link.lock().expect("lock");
        let socket = link.socket.as_ref().expect("socket");
        let patience = nix::sys::time::TimeVal::new(0, 100_000);
        socket::setsockopt(socket, socket::sockopt::ReceiveTimeout, &patience).expect("timeout");
    }
    let err = helper.namespace_identity(CONTROLLER, SLOW_NSID).expect_err("too slow");
    assert!(err.to_string().contains("gone or stuck"), "{err}");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let next = helper.namespace_identity(CONTROLLER, 1);
    assert!(next.is_err(), "the late reply answered the next request: {next:?}");
}
