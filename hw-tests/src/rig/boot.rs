//! Booting the rig: QEMU guests (their command lines, readiness, the
//! controllers they came up with) or this machine's own devices.

use std::os::fd::{AsRawFd, RawFd};

use super::qmp::{qmp_socket, WIRE_NIC_ID};
use super::*;

impl Rig {
    pub(super) fn boot_guests(spec: RigBuilder) -> Result<Self, RigError> {
        let qemu = find_program("qemu-system-x86_64", "qemu-system-x86")?;
        let root = rig_root();
        let cache = root.join("cache");
        let (kernel, initrd) = {
            // Tests boot rigs in parallel; one of them fills the cache.
            let _lock = lock_cache(&cache)?;
            let kernel = kernel::fetch(&cache)?;
            let initrd = initramfs::build(&kernel, &cache)?;
            (kernel, initrd)
        };
        let run_dir = new_run_dir(&root, &spec.test)?;
        let share = run_dir.join("share");
        for host in [Host::Storage, Host::Training].into_iter().take(spec.hosts) {
            let dir = share.join(host.name());
            for sub in ["req", "run", "out"] {
                std::fs::create_dir_all(dir.join(sub)).map_err(|e| RigError::io("creating the share", e))?;
            }
            let mut env = String::new();
            if spec.hosts > 1 {
                env += &format!("RIG_ADDR={}\n", host.wire_addr());
                let peer = if host == Host::Storage { Host::Training } else { Host::Storage };
                env += &format!("RIG_PEER_ADDR={}\nRIG_PEER_MAC={}\n", peer.wire_addr(), peer.wire_mac());
            }
            if spec.rdma {
                env += "RIG_RDMA=1\n";
            }
            if host == Host::Storage && spec.hugepages > 0 {
                env += &format!("RIG_HUGEPAGES={}\n", spec.hugepages);
            }
            std::fs::write(dir.join("env"), env).map_err(|e| RigError::io("writing a guest env", e))?;
        }
        std::fs::write(share.join("agent.sh"), include_str!("../../guest/agent.sh"))
            .map_err(|e| RigError::io("writing the agent", e))?;

        let wire = if spec.hosts > 1 { Some(Wire::bind()?) } else { None };
        let wire_ports = wire.as_ref().map_or([0, 0], |wire| wire.ports);
        let mut guests = Vec::new();
        for host in [Host::Storage, Host::Training].into_iter().take(spec.hosts) {
            let wire_fd = wire.as_ref().map(|wire| wire.sockets[host.index()].as_raw_fd());
            let args = qemu_args(&spec, host, &kernel, &initrd, &run_dir, &share, wire_fd)?;
            let console = run_dir.join(format!("{}.console", host.name()));
            guests.push(Guest::spawn(host.name(), &qemu, &args, &console, wire_fd)?);
        }
        // Each QEMU holds its end now; this process never reads them.
        drop(wire);
        let mut rig = Self {
            spec,
            backend: Backend::Guests { guests, share: share.clone(), wire_ports },
            run_dir,
            controllers: Vec::new(),
            next_request: AtomicU64::new(0),
            keep_logs: false,
        };
        rig.wait_ready(&share)?;
        rig.controllers = rig.find_controllers()?;
        Ok(rig)
    }

    pub(super) fn wait_ready(&mut self, share: &Path) -> Result<(), RigError> {
        let started = Instant::now();
        let Backend::Guests { guests, .. } = &mut self.backend else { return Ok(()) };
        for guest in guests.iter_mut() {
            let ready = share.join(&guest.name).join("ready");
            while !ready.exists() {
                let waited = started.elapsed();
                let failure = match guest.exited() {
                    Some(status) => Some(format!("QEMU exited: {status}")),
                    None if waited > self.spec.boot_timeout => Some("no answer from the agent".to_string()),
                    None => None,
                };
                if let Some(reason) = failure {
                    return Err(RigError::Boot {
                        host: guest.name.clone(),
                        seconds: waited.as_secs(),
                        reason,
                        log: guest.console_log.display().to_string(),
                    });
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// Finds the storage host's controllers by the serials the rig gave them.
    pub(super) fn find_controllers(&self) -> Result<Vec<NvmeController>, RigError> {
        if self.spec.nvme_controllers == 0 {
            return Ok(Vec::new());
        }
        let listing = self.sh(
            Host::Storage,
            "for c in /sys/class/nvme/nvme*; do \
               echo \"$(basename $c) $(cat $c/serial) $(basename $(readlink -f $c/device))\"; done",
        )?;
        let mut controllers = Vec::new();
        for i in 0..self.spec.nvme_controllers {
            let serial = format!("sluice{i}");
            let line = listing.lines().find(|l| l.split_whitespace().nth(1) == Some(serial.as_str()));
            let Some(line) = line else {
                return Err(RigError::Command {
                    what: "finding the rig's NVMe controllers".into(),
                    status: 0,
                    stderr: format!("no controller with serial {serial} in:\n{listing}"),
                });
            };
            let fields: Vec<&str> = line.split_whitespace().collect();
            controllers.push(NvmeController { name: fields[0].to_string(), pci: fields[2].to_string() });
        }
        Ok(controllers)
    }

    pub(super) fn local(spec: RigBuilder, hw: Hardware) -> Result<Self, RigError> {
        let run_dir = new_run_dir(&rig_root(), &spec.test)?;
        let mut controllers = Vec::new();
        for pci in &hw.nvme {
            let dir = PathBuf::from("/sys/bus/pci/devices").join(pci).join("nvme");
            let name = std::fs::read_dir(&dir)
                .map_err(|e| RigError::io(&format!("SLUICE_HW_NVME names {pci}, which has no {}", dir.display()), e))?
                .flatten()
                .filter_map(|entry| entry.file_name().to_str().map(str::to_string))
                .next()
                .ok_or_else(|| RigError::Missing(Missing(format!("{pci} is not bound to the nvme driver"))))?;
            controllers.push(NvmeController { pci: pci.clone(), name });
        }
        if controllers.len() < spec.nvme_controllers {
            return Err(RigError::Missing(Missing(format!(
                "the test needs {} NVMe controllers; SLUICE_HW_NVME names {}",
                spec.nvme_controllers,
                controllers.len()
            ))));
        }
        if spec.rdma && hw.rdma.is_none() {
            return Err(RigError::Missing(Missing("the test needs RDMA; SLUICE_HW_RDMA names no device".into())));
        }
        Ok(Self {
            spec,
            backend: Backend::Local(hw),
            run_dir,
            controllers,
            next_request: AtomicU64::new(0),
            keep_logs: false,
        })
    }
}

pub(super) fn qemu_args(
    spec: &RigBuilder,
    host: Host,
    kernel: &kernel::Kernel,
    initrd: &Path,
    run_dir: &Path,
    share: &Path,
    wire_fd: Option<RawFd>,
) -> Result<Vec<String>, RigError> {
    let mut args: Vec<String> = Vec::new();
    let mut push = |parts: &[&str]| args.extend(parts.iter().map(|s| s.to_string()));
    let storage_with_nvme = host == Host::Storage && spec.nvme_controllers > 0;
    push(&["-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "1", "-nographic", "-no-reboot"]);
    push(&["-m", &format!("{}M", spec.memory_mib)]);
    let mut cmdline = format!("console=ttyS0 panic=-1 quiet rig.host={}", host.name());
    if storage_with_nvme {
        // A virtual IOMMU so vfio-pci (SPDK) can own a controller.
        push(&["-machine", "q35,kernel-irqchip=split"]);
        push(&["-device", "intel-iommu,intremap=on,caching-mode=on,aw-bits=48"]);
        cmdline += " intel_iommu=on";
    }
    push(&["-kernel", &kernel.vmlinuz.display().to_string(), "-initrd", &initrd.display().to_string()]);
    push(&["-append", &cmdline]);
    push(&["-fsdev", "local,id=hr,path=/,security_model=none,readonly=on,multidevs=remap"]);
    push(&["-device", "virtio-9p-pci,fsdev=hr,mount_tag=hostroot"]);
    push(&["-fsdev", &format!("local,id=rs,path={},security_model=none", share.display())]);
    push(&["-device", "virtio-9p-pci,fsdev=rs,mount_tag=rigshare"]);
    if let Some(wire_fd) = wire_fd {
        // A datagram wire: each guest's frames go to the other's UDP port
        // on loopback, one frame a datagram ([`Wire`]). A stream wire (`socket,listen`)
        // couples the two QEMUs: a full socket stops the sender's virtio-net
        // transmit queue until the socket drains, and under soft-RoCE load
        // the storage guest's transmit queue then stayed stopped for good
        // (its packet count frozen, the socket empty). Here a full receiver
        // drops a frame, as a real link does, and rxe and TCP resend it.
        push(&["-netdev", &format!("dgram,id=wire,local.type=fd,local.str={wire_fd}")]);
        // tx=timer: QEMU 7.2's default transmit bottom half now and then
        // stopped taking the storage guest's frames for good (QMP: the
        // guest's avail index ahead, nothing in use, the socket empty);
        // with the timer, a kick while a flush is pending flushes at once.
        // 0 deaths in 20 runs of the RDMA test, against about 1 in 10.
        push(&["-device", &format!("virtio-net-pci,netdev=wire,id={WIRE_NIC_ID},tx=timer,mac={}", host.wire_mac())]);
        // QEMU's own view of that NIC's queues, for the wire report.
        if let Ok(qmp) = qmp_socket(run_dir, host) {
            push(&["-qmp", &format!("unix:{},server=on,wait=off", qmp.display())]);
        }
    }
    if storage_with_nvme {
        let images = run_dir.join("images");
        std::fs::create_dir_all(&images).map_err(|e| RigError::io("creating the NVMe images directory", e))?;
        for c in 0..spec.nvme_controllers {
            push(&["-device", &format!("nvme-subsys,id=subsys{c},nqn=nqn.2026-11.io.sluice:subsys{c}")]);
            push(&["-device", &format!("nvme,serial=sluice{c},id=nvme{c},subsys=subsys{c}")]);
            for n in 1..=spec.namespaces_each {
                let image = images.join(format!("c{c}n{n}.img"));
                let file = std::fs::File::create(&image).map_err(|e| RigError::io("creating an NVMe image", e))?;
                // Sparse: the image costs only what the guest writes.
                file.set_len(spec.namespace_mib << 20).map_err(|e| RigError::io("sizing an NVMe image", e))?;
                let detached = n + spec.detached_each > spec.namespaces_each;
                push(&["-drive", &format!("file={},if=none,id=c{c}n{n},format=raw,discard=unmap", image.display())]);
                push(&[
                    "-device",
                    &format!(
                        // shared=off: a namespace of this host alone (NMIC 0),
                        // which is all the node will attach.
                        "nvme-ns,drive=c{c}n{n},bus=nvme{c},nsid={n},shared=off{}",
                        if detached { ",detached=on" } else { "" }
                    ),
                ]);
            }
        }
    }
    Ok(args)
}

/// An exclusive lock on the cache, across threads and processes (flock
/// locks belong to each open of the file).
pub(super) fn lock_cache(cache: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, RigError> {
    std::fs::create_dir_all(cache).map_err(|e| RigError::io("creating the rig cache", e))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache.join("lock"))
        .map_err(|e| RigError::io("opening the cache lock", e))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| RigError::io("locking the rig cache", errno.into()))
}

/// The wire between two guests: a UDP socket on loopback for each
/// (storage first), bound and connected to the other before either QEMU
/// starts, and handed to its QEMU as an open fd. Choosing free ports
/// and letting each QEMU bind its own left a window in which another
/// process (another rig booting beside this one) could take a port.
struct Wire {
    sockets: [std::net::UdpSocket; 2],
    ports: [u16; 2],
}

impl Wire {
    fn bind() -> Result<Self, RigError> {
        let bind = || std::net::UdpSocket::bind("127.0.0.1:0").map_err(|e| RigError::io("binding a wire socket", e));
        let sockets = [bind()?, bind()?];
        let address = |socket: &std::net::UdpSocket| {
            socket.local_addr().map_err(|e| RigError::io("reading a wire socket's address", e))
        };
        let addresses = [address(&sockets[0])?, address(&sockets[1])?];
        for (socket, peer) in sockets.iter().zip(addresses.iter().rev()) {
            socket.connect(peer).map_err(|e| RigError::io("connecting a wire socket", e))?;
        }
        Ok(Self { sockets, ports: addresses.map(|a| a.port()) })
    }
}
