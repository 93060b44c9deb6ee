//! Steering: the node's shared maps (`bpf/steer.bpf.c`), the mmapped
//! decision array the data plane reads per batch, run-time swaps of the
//! policy program, and the `sk_reuseport` program on the TCP listener.
//!
//! A policy is a BPF object with a uprobe program `lane_policy` that
//! declares the maps of `include/sluice_steer.h`. To make its maps the
//! node's own, the node pins them in a private bpffs instance for the
//! length of the load (aya reuses a pinned map by path) and unmounts it
//! after, so nothing is left behind, even if the node is killed.

use std::net::{IpAddr, TcpListener};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use aya::maps::{HashMap, Map, MapData, MapError, ReusePortSockArray};
use aya::programs::{ProgramError, SkReuseport, UProbe};
use aya::{Ebpf, EbpfError, EbpfLoader};
use sluice_dataplane::steer::{peer_key, LaneDecisions, DECISION_BULK, DECISION_LATENCY, DECISION_NONE, FLOWS_MAX};
use zerocopy::IntoBytes;

use crate::Scope;

/// The node's steering maps and `sk_reuseport` program, as `bpf/build.sh`
/// compiles them.
pub static STEER_OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/steer.bpf.o");
/// The default policy: small-range share and byte rate per flow.
pub static DEFAULT_POLICY_OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/policy.bpf.o");
/// The policy that puts every flow in the bulk lane.
pub static ALL_BULK_POLICY_OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/all_bulk.bpf.o");

/// The uprobe program every policy object provides.
pub const POLICY_PROGRAM: &str = "lane_policy";
/// Largest policy object accepted (the default one is ~16 KiB).
pub const POLICY_OBJECT_BYTES_MAX: usize = 4 << 20;
/// Index of the latency-lane worker socket in the `workers` map.
pub const WORKER_LATENCY: u32 = 0;
/// Index of the bulk-lane worker socket.
pub const WORKER_BULK: u32 = 1;

const SHARED_MAPS: [&str; 2] = ["lane_decisions", "peer_lanes"];

#[derive(Debug, thiserror::Error)]
pub enum SteerError {
    #[error("loading BPF object: {0}")]
    Load(#[from] EbpfError),
    #[error("BPF program: {0}")]
    Program(#[from] ProgramError),
    #[error("BPF map: {0}")]
    Map(#[from] MapError),
    #[error("pinning a shared map: {0}")]
    Pin(#[from] aya::pin::PinError),
    #[error("the object has no {0}: a policy declares the maps of sluice_steer.h and a uprobe `lane_policy`")]
    Missing(&'static str),
    #[error("policy object is {0} bytes; at most {POLICY_OBJECT_BYTES_MAX}")]
    TooLarge(usize),
    #[error("{0}")]
    Refused(#[from] crate::policy_check::PolicyRefusal),
    #[error("{0}: {1}")]
    Os(&'static str, std::io::Error),
}

impl SteerError {
    /// Whether the kernel refused for lack of privilege.
    pub fn is_permission(&self) -> bool {
        crate::refused_for_privilege(self)
    }
}

/// The decision array, mapped into the node: the data plane loads one
/// word per batch; the node stores only to clear a reused flow's entry.
pub struct MappedDecisions {
    base: NonNull<AtomicU64>,
    len_bytes: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics, and
// it stays mapped until drop.
unsafe impl Send for MappedDecisions {}
// SAFETY: as above.
unsafe impl Sync for MappedDecisions {}

impl MappedDecisions {
    fn map(map: &MapData) -> Result<Self, SteerError> {
        let page = 4096usize;
        // One u64 a flow: BPF array elements are 8-byte aligned.
        let len_bytes = (FLOWS_MAX as usize * size_of::<u64>()).div_ceil(page) * page;
        let fd = map.fd().as_fd();
        // SAFETY: mapping a BPF_F_MMAPABLE array's fd is how the kernel
        // shares its values; the length covers FLOWS_MAX u64 values rounded
        // up to a page, exactly what an array of that size provides.
        let base = unsafe {
            nix::sys::mman::mmap(
                None,
                std::num::NonZeroUsize::new(len_bytes).ok_or(SteerError::Missing("decision array"))?,
                nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE,
                nix::sys::mman::MapFlags::MAP_SHARED,
                fd,
                0,
            )
        }
        .map_err(|e| SteerError::Os("mmap of lane_decisions", e.into()))?;
        Ok(Self { base: base.cast(), len_bytes })
    }

    fn word(&self, index: u32) -> Option<&AtomicU64> {
        if index >= FLOWS_MAX {
            return None;
        }
        // SAFETY: index < FLOWS_MAX, inside the mapping, which lives as long
        // as self; the kernel's BPF programs write it with plain stores of
        // aligned u64s, which an atomic load observes whole.
        Some(unsafe { &*self.base.as_ptr().add(index as usize) })
    }
}

impl LaneDecisions for MappedDecisions {
    fn decision(&self, index: u32) -> u32 {
        // Values past u32 are no decision, like any unknown value.
        self.word(index).map_or(DECISION_NONE, |w| u32::try_from(w.load(Ordering::Relaxed)).unwrap_or(DECISION_NONE))
    }

    fn clear(&self, index: u32) {
        if let Some(word) = self.word(index) {
            word.store(u64::from(DECISION_NONE), Ordering::Relaxed);
        }
    }
}

impl Drop for MappedDecisions {
    fn drop(&mut self) {
        // SAFETY: base and len_bytes are the mapping made in `map`; no
        // reference into it outlives self.
        if let Err(err) = unsafe { nix::sys::mman::munmap(self.base.cast(), self.len_bytes) } {
            eprintln!("munmap of lane_decisions: {err}");
        }
    }
}

/// What policy runs now.
pub use sluice_proto::api::PolicyInfo;

struct LoadedPolicy {
    // Dropping the Ebpf detaches its uprobe.
    _bpf: Ebpf,
    info: PolicyInfo,
}

/// The node's steering: shared maps, the mapped decision array, and the
/// policy attached now (if any).
pub struct Steering {
    bpf: Ebpf,
    lane_decisions: Map,
    peer_lanes: Map,
    decisions: Arc<MappedDecisions>,
    binary: PathBuf,
    scope: Scope,
    policy: Option<LoadedPolicy>,
    swaps: AtomicU64,
}

impl Steering {
    /// Creates the shared maps and maps the decision array; policies are
    /// attached to `sluice_probe_batch_complete` in `binary`.
    pub fn start(binary: &Path, scope: Scope) -> Result<Self, SteerError> {
        let mut bpf = Ebpf::load(STEER_OBJECT)?;
        let lane_decisions = bpf.take_map("lane_decisions").ok_or(SteerError::Missing("lane_decisions"))?;
        let peer_lanes = bpf.take_map("peer_lanes").ok_or(SteerError::Missing("peer_lanes"))?;
        let Map::Array(data) = &lane_decisions else { return Err(SteerError::Missing("array lane_decisions")) };
        let decisions = Arc::new(MappedDecisions::map(data)?);
        let program: &mut SkReuseport =
            bpf.program_mut("select_worker").ok_or(SteerError::Missing("select_worker"))?.try_into()?;
        program.load()?;
        Ok(Self {
            bpf,
            lane_decisions,
            peer_lanes,
            decisions,
            binary: binary.to_owned(),
            scope,
            policy: None,
            swaps: AtomicU64::new(0),
        })
    }

    /// The decision array, for [`sluice_dataplane::DataPlane::steer_with`].
    pub fn decisions(&self) -> Arc<dyn LaneDecisions> {
        Arc::clone(&self.decisions) as Arc<dyn LaneDecisions>
    }

    /// Loads `object` as the policy and attaches it, then detaches the one
    /// it replaces: for a moment both run, and both write only decisions,
    /// so no batch ever sees a half-swapped policy. On error the old one
    /// stays.
    pub fn load_policy(&mut self, name: &str, object: &[u8]) -> Result<PolicyInfo, SteerError> {
        if object.len() > POLICY_OBJECT_BYTES_MAX {
            return Err(SteerError::TooLarge(object.len()));
        }
        // Nothing of an object reaches the kernel before it passes.
        crate::policy_check::check(object)?;
        // aya parses the ELF in place and wants it 8-byte aligned.
        let mut aligned = vec![0u64; object.len().div_ceil(8)];
        aligned.as_mut_bytes()[..object.len()].copy_from_slice(object);
        let bytes = &aligned.as_bytes()[..object.len()];
        let mut bpf = with_private_bpffs(|dir| {
            let paths: Vec<PathBuf> = SHARED_MAPS.iter().map(|name| dir.join(name)).collect();
            self.lane_decisions.pin(&paths[0])?;
            self.peer_lanes.pin(&paths[1])?;
            let mut loader = EbpfLoader::new();
            for (map, path) in SHARED_MAPS.iter().zip(&paths) {
                loader.map_pin_path(map, path.as_path());
            }
            Ok(loader.load(bytes)?)
        })?;
        for map in SHARED_MAPS {
            if bpf.map(map).is_none() {
                return Err(SteerError::Missing(map));
            }
        }
        let program: &mut UProbe =
            bpf.program_mut(POLICY_PROGRAM).ok_or(SteerError::Missing("uprobe lane_policy"))?.try_into()?;
        program.load()?;
        program.attach("sluice_probe_batch_complete", &self.binary, self.scope.uprobe_scope())?;
        let info = PolicyInfo {
            name: name.to_owned(),
            object_hash: format!("blake3:{}", blake3::hash(object).to_hex()),
            object_bytes: object.len() as u64,
            loaded_at_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        self.policy = Some(LoadedPolicy { _bpf: bpf, info: info.clone() });
        self.swaps.fetch_add(1, Ordering::Relaxed);
        Ok(info)
    }

    /// Detaches the policy and forgets every decision: the size threshold
    /// decides again, and peers' new connections spread by hash.
    pub fn unload_policy(&mut self) -> Result<Option<PolicyInfo>, SteerError> {
        let old = self.policy.take().map(|p| p.info);
        for flow in 0..FLOWS_MAX {
            self.decisions.clear(flow);
        }
        let mut peers: HashMap<&mut MapData, [u8; 16], u32> = HashMap::try_from(&mut self.peer_lanes)?;
        let keys = peers.keys().collect::<Result<Vec<_>, _>>()?;
        for key in keys {
            peers.remove(&key)?;
        }
        Ok(old)
    }

    pub fn policy(&self) -> Option<PolicyInfo> {
        self.policy.as_ref().map(|p| p.info.clone())
    }

    /// Policies loaded since start.
    pub fn swaps(&self) -> u64 {
        self.swaps.load(Ordering::Relaxed)
    }

    /// Flows per decision now: (none, latency, bulk).
    pub fn decision_counts(&self) -> (u32, u32, u32) {
        let mut counts = (0, 0, 0);
        for flow in 0..FLOWS_MAX {
            match self.decisions.decision(flow) {
                DECISION_LATENCY => counts.1 += 1,
                DECISION_BULK => counts.2 += 1,
                _ => counts.0 += 1,
            }
        }
        counts
    }

    /// The decision for `peer`'s next connections, if any.
    pub fn peer_decision(&self, peer: IpAddr) -> Result<Option<u32>, SteerError> {
        let peers: HashMap<&MapData, [u8; 16], u32> = HashMap::try_from(&self.peer_lanes)?;
        match peers.get(&peer_key(peer), 0) {
            Ok(decision) => Ok(Some(decision)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// Sets the decision for `peer` by hand (operators pinning a host to a
    /// lane; tests).
    pub fn set_peer_decision(&mut self, peer: IpAddr, decision: u32) -> Result<(), SteerError> {
        let mut peers: HashMap<&mut MapData, [u8; 16], u32> = HashMap::try_from(&mut self.peer_lanes)?;
        peers.insert(peer_key(peer), decision, 0)?;
        Ok(())
    }

    /// Makes `latency` and `bulk`, two listeners of one `SO_REUSEPORT`
    /// group, the worker sockets, and attaches the `sk_reuseport` program
    /// that picks between them by the peer's decision. The program stays
    /// with the group until its sockets close.
    pub fn steer_listeners(&mut self, latency: &TcpListener, bulk: &TcpListener) -> Result<(), SteerError> {
        let mut workers: ReusePortSockArray<&mut MapData> =
            ReusePortSockArray::try_from(self.bpf.map_mut("workers").ok_or(SteerError::Missing("workers"))?)?;
        workers.set(WORKER_LATENCY, latency, 0)?;
        workers.set(WORKER_BULK, bulk, 0)?;
        let program: &SkReuseport =
            self.bpf.program("select_worker").ok_or(SteerError::Missing("select_worker"))?.try_into()?;
        program.attach(latency)?;
        Ok(())
    }
}

/// Runs `f` with a fresh bpffs instance mounted on a new directory, then
/// unmounts it: whatever `f` pinned there is unpinned with it.
fn with_private_bpffs<T>(f: impl FnOnce(&Path) -> Result<T, SteerError>) -> Result<T, SteerError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sluice-bpffs-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir(&dir).map_err(|e| SteerError::Os("creating a bpffs mount point", e))?;
    let mounted = nix::mount::mount(Some("bpf"), &dir, Some("bpf"), nix::mount::MsFlags::empty(), None::<&str>);
    let result = match mounted {
        Ok(()) => {
            let checked = nix::sys::statfs::statfs(&dir)
                .map_err(|e| SteerError::Os("statfs of the bpffs mount", e.into()))
                .and_then(|fs| {
                    if fs.filesystem_type() == nix::sys::statfs::FsType(0xcafe_4a11) {
                        Ok(())
                    } else {
                        Err(SteerError::Os("mounting bpffs", std::io::Error::other("not a bpffs after mount")))
                    }
                });
            let result = checked.and_then(|()| f(&dir));
            if let Err(err) = nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH) {
                eprintln!("unmounting {}: {err}", dir.display());
            }
            result
        }
        Err(err) => Err(SteerError::Os("mounting a private bpffs (needs CAP_SYS_ADMIN)", err.into())),
    };
    let _ = std::fs::remove_dir(&dir);
    result
}

/// Two TCP listeners of one `SO_REUSEPORT` group on `addr` (the second on
/// the port the first got, when `addr`'s port is 0): the latency-lane and
/// bulk-lane worker sockets for [`Steering::steer_listeners`].
pub fn reuseport_pair(addr: std::net::SocketAddr, backlog: i32) -> std::io::Result<(TcpListener, TcpListener)> {
    let mut group = reuseport_group(addr, 2, backlog)?;
    let bulk = group.pop();
    let latency = group.pop();
    latency.zip(bulk).ok_or_else(|| std::io::Error::other("a reuseport group of two came back short"))
}

/// `count` TCP listeners of one `SO_REUSEPORT` group on `addr` (all on the
/// port the first got, when `addr`'s port is 0). Without a `sk_reuseport`
/// program the kernel spreads connections over them by a hash of the
/// connection's addresses; only sockets of this user may join the group.
///
/// A port another group already listens on is refused, as a plain bind
/// would be: without the probe a second node started on the same port by
/// the same user would silently join the first one's group and take a
/// share of its connections.
pub fn reuseport_group(addr: std::net::SocketAddr, count: usize, backlog: i32) -> std::io::Result<Vec<TcpListener>> {
    assert!(count >= 1, "a listener group needs a listener");
    if addr.port() != 0 {
        // A socket without SO_REUSEPORT cannot bind a port a group holds.
        drop(TcpListener::bind(addr)?);
    }
    let first = reuseport_listener(addr, backlog)?;
    let bound = first.local_addr()?;
    let mut group = Vec::with_capacity(count);
    group.push(first);
    for _ in 1..count {
        group.push(reuseport_listener(bound, backlog)?);
    }
    Ok(group)
}

fn reuseport_listener(addr: std::net::SocketAddr, backlog: i32) -> std::io::Result<TcpListener> {
    use nix::sys::socket::{
        bind, listen, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage,
    };
    let family = if addr.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    setsockopt(&fd, sockopt::ReusePort, &true)?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(addr))?;
    listen(&fd, Backlog::new(backlog).unwrap_or(Backlog::MAXCONN))?;
    Ok(TcpListener::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listener of a group shares the port the first got; a second
    /// group on a port the first holds is refused (as a plain bind is),
    /// instead of joining it; the port is free again once the group goes.
    #[test]
    fn a_group_takes_one_port_and_no_second_group_joins_it() {
        let group = reuseport_group("127.0.0.1:0".parse().expect("addr"), 3, 16).expect("group");
        let port = group[0].local_addr().expect("addr").port();
        assert!(group.iter().all(|l| l.local_addr().expect("addr").port() == port));
        let taken = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let second = reuseport_group(taken, 2, 16).expect_err("a second group joined the first");
        assert_eq!(second.kind(), std::io::ErrorKind::AddrInUse);
        drop(group);
        let again = reuseport_group(taken, 2, 16).expect("the port after the group closed");
        assert_eq!(again.len(), 2);
    }
}
