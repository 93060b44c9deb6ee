//! Completion queues (with their completion channel) and RC queue pairs.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr;
use std::sync::Arc;

use rdma_sys::{ibv_comp_channel, ibv_cq, ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc};

use super::{CmId, ProtectionDomain, VerbsError};

/// A completion queue and the channel that says when it has entries. The
/// channel's fd is non-blocking, for `tokio::io::unix::AsyncFd`.
pub struct CompletionQueue {
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
}

// SAFETY: verbs calls are thread-safe; one task polls a CQ at a time.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

/// One work completion, copied out of the CQ.
#[derive(Clone, Copy, Debug)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
}

impl WorkCompletion {
    pub fn is_ok(&self) -> bool {
        self.status == rdma_sys::ibv_wc_status::IBV_WC_SUCCESS
    }

    pub fn is_recv(&self) -> bool {
        self.opcode & rdma_sys::ibv_wc_opcode::IBV_WC_RECV != 0
    }

    /// The status as the verbs name it.
    pub fn status_text(&self) -> String {
        // SAFETY: returns a static string for any value.
        let text = unsafe { CStr::from_ptr(rdma_sys::ibv_wc_status_str(self.status)) };
        text.to_string_lossy().into_owned()
    }
}

impl CompletionQueue {
    /// A CQ of `entries` on the device of `id`, armed for its first event.
    pub fn new(id: &CmId, entries: u32) -> Result<Arc<Self>, VerbsError> {
        let context = id.context();
        if context.is_null() {
            return Err(VerbsError::code("ibv_create_comp_channel", nix::libc::ENODEV));
        }
        // SAFETY: a live device context.
        let channel = unsafe { rdma_sys::ibv_create_comp_channel(context) };
        if channel.is_null() {
            return Err(VerbsError::last("ibv_create_comp_channel"));
        }
        // SAFETY: live context and channel; no CQ context pointer.
        let cq = unsafe { rdma_sys::ibv_create_cq(context, entries as i32, ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let err = VerbsError::last("ibv_create_cq");
            // SAFETY: created above, no CQ uses it.
            unsafe { rdma_sys::ibv_destroy_comp_channel(channel) };
            return Err(err);
        }
        let queue = Arc::new(Self { cq, channel });
        // SAFETY: `channel` is live; its fd belongs to it.
        super::cm::set_nonblocking(unsafe { (*channel).fd }, "completion channel")?;
        queue.arm()?;
        Ok(queue)
    }

    /// Asks for an event on the next completion.
    pub fn arm(&self) -> Result<(), VerbsError> {
        // SAFETY: live CQ.
        let ret = unsafe { rdma_sys::ibv_req_notify_cq(self.cq, 0) };
        if ret != 0 {
            return Err(VerbsError::code("ibv_req_notify_cq", ret));
        }
        Ok(())
    }

    /// Consumes the channel's pending events (acking them) and re-arms; poll
    /// afterwards so that nothing that raced the re-arm is missed.
    pub fn take_events(&self) -> Result<(), VerbsError> {
        let mut events = 0u32;
        loop {
            let mut cq = ptr::null_mut();
            let mut context = ptr::null_mut();
            // SAFETY: live channel; valid out-pointers.
            if unsafe { rdma_sys::ibv_get_cq_event(self.channel, &mut cq, &mut context) } != 0 {
                let err = VerbsError::last("ibv_get_cq_event");
                if !err.would_block() {
                    return Err(err);
                }
                break;
            }
            events += 1;
        }
        if events > 0 {
            // SAFETY: acks exactly the events taken above, all for this CQ
            // (the channel serves only it).
            unsafe { rdma_sys::ibv_ack_cq_events(self.cq, events) };
        }
        self.arm()
    }

    /// Moves up to `out.len()` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize, VerbsError> {
        const STEP: usize = 32;
        // SAFETY: ibv_wc is plain data; zero is a valid value.
        let mut raw: [ibv_wc; STEP] = unsafe { std::mem::zeroed() };
        let mut taken = 0;
        while taken < max {
            let want = (max - taken).min(STEP);
            // SAFETY: live CQ; `raw` holds `want` entries.
            let got = unsafe { rdma_sys::ibv_poll_cq(self.cq, want as i32, raw.as_mut_ptr()) };
            if got < 0 {
                return Err(VerbsError::code("ibv_poll_cq", -got));
            }
            for wc in &raw[..got as usize] {
                out.push(WorkCompletion {
                    wr_id: wc.wr_id,
                    status: wc.status,
                    opcode: wc.opcode,
                    byte_len: wc.byte_len,
                });
            }
            taken += got as usize;
            if (got as usize) < want {
                break;
            }
        }
        Ok(taken)
    }
}

impl AsRawFd for CompletionQueue {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: the channel lives as long as `self`.
        unsafe { (*self.channel).fd }
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: the QPs using this CQ hold an Arc of it, so they are gone;
        // all events were acked in `take_events`. Each destroyed once, the
        // CQ before its channel.
        unsafe {
            rdma_sys::ibv_destroy_cq(self.cq);
            rdma_sys::ibv_destroy_comp_channel(self.channel);
        }
    }
}

/// Queue sizes asked for at creation; the device may grant more.
#[derive(Clone, Copy, Debug)]
pub struct QueueCaps {
    pub send_wr: u32,
    pub recv_wr: u32,
    pub send_sge: u32,
}

/// A scatter-gather entry: registered memory by its local key.
#[derive(Clone, Copy, Debug)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

#[derive(Clone, Copy, Debug)]
pub enum SendOp {
    Send,
    /// Writes into the peer's memory registered under `rkey`.
    Write {
        remote_addr: u64,
        rkey: u32,
    },
    /// As `Write`, and consumes a receive at the peer with `imm`.
    WriteWithImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
}

/// One send-queue work request.
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub op: SendOp,
    pub sges: &'a [Sge],
    /// Whether its completion is reported (errors always are).
    pub signaled: bool,
}

/// An RC queue pair on an rdma_cm id. Dropping it disconnects, destroys
/// the QP (unless [`QueuePair::destroy`] did), then the id, then lets go of
/// its CQ and PD.
pub struct QueuePair {
    // Field order is drop order after `Drop::drop` destroyed the QP.
    id: CmId,
    /// Set by [`QueuePair::destroy`]: no work request may be posted since.
    destroyed: bool,
    cq: Arc<CompletionQueue>,
    _pd: ProtectionDomain,
    caps: QueueCaps,
    wrs: Vec<ibv_send_wr>,
    sges: Vec<ibv_sge>,
}

// SAFETY: the scratch vectors only hold pointers while `post_send` runs;
// the verbs objects are thread-safe.
unsafe impl Send for QueuePair {}

impl QueuePair {
    /// Creates an RC QP on `id` whose sends and receives complete on `cq`.
    pub fn create(
        id: CmId,
        pd: &ProtectionDomain,
        cq: &Arc<CompletionQueue>,
        caps: QueueCaps,
    ) -> Result<Self, VerbsError> {
        if !pd.serves(&id) {
            return Err(VerbsError::code("rdma_create_qp (protection domain of another device)", nix::libc::EINVAL));
        }
        let mut attr = ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: cq.cq,
            recv_cq: cq.cq,
            srq: ptr::null_mut(),
            cap: rdma_sys::ibv_qp_cap {
                max_send_wr: caps.send_wr,
                max_recv_wr: caps.recv_wr,
                max_send_sge: caps.send_sge,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: rdma_sys::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live id, PD and CQ of the same device; attr outlives the call.
        if unsafe { rdma_sys::rdma_create_qp(id.raw(), pd.raw(), &mut attr) } != 0 {
            return Err(VerbsError::last("rdma_create_qp"));
        }
        let granted = QueueCaps {
            send_wr: attr.cap.max_send_wr,
            recv_wr: attr.cap.max_recv_wr,
            send_sge: attr.cap.max_send_sge.min(caps.send_sge.max(1)),
        };
        Ok(Self {
            id,
            destroyed: false,
            cq: Arc::clone(cq),
            _pd: pd.clone(),
            caps: granted,
            wrs: Vec::new(),
            sges: Vec::new(),
        })
    }

    pub fn id(&self) -> &CmId {
        &self.id
    }

    pub fn cq(&self) -> &Arc<CompletionQueue> {
        &self.cq
    }

    pub fn caps(&self) -> QueueCaps {
        self.caps
    }

    /// Moves the QP to the error state: the device stops working on its
    /// send queue and completes every outstanding work request (flushed),
    /// so once a request's completion is polled its memory is free again.
    /// Unlike [`QueuePair::destroy`] this never waits on the peer or the
    /// CM: a connection frees what its requests held without the teardown
    /// that may block. Work requests may not be posted afterwards.
    pub fn to_error(&mut self) -> Result<(), VerbsError> {
        if self.destroyed {
            return Ok(());
        }
        // SAFETY: ibv_qp_attr is plain data; zero is a valid value.
        let mut attr: rdma_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = rdma_sys::ibv_qp_state::IBV_QPS_ERR;
        let mask = rdma_sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32;
        // SAFETY: a live QP (not destroyed, by the flag); attr outlives the
        // call.
        let ret = unsafe { rdma_sys::ibv_modify_qp((*self.id.raw()).qp, &mut attr, mask) };
        if ret != 0 {
            return Err(VerbsError::code("ibv_modify_qp (to error)", ret));
        }
        Ok(())
    }

    /// Disconnects and destroys the QP now, leaving the id (and the CQ and
    /// PD) to the drop. Once this returns the device touches none of the
    /// memory the QP's work requests named, so their buffers may be reused;
    /// destroying the id may then block (for the CM's disconnect timeout,
    /// when the peer is gone) without holding them. Idempotent.
    pub fn destroy(&mut self) {
        if std::mem::replace(&mut self.destroyed, true) {
            return;
        }
        // Tell the peer first; it may already be gone.
        let _ = self.id.disconnect();
        // SAFETY: the QP was created on this id and, by the flag, is
        // destroyed once; nothing is posted to it afterwards (the posting
        // methods assert the flag).
        unsafe { rdma_sys::rdma_destroy_qp(self.id.raw()) };
    }

    /// Posts one receive into `sge`.
    ///
    /// # Safety
    /// `sge` must name registered local-write memory that nothing else
    /// touches until its completion is polled or the QP is destroyed.
    pub unsafe fn post_recv(&mut self, wr_id: u64, sge: Sge) -> Result<(), VerbsError> {
        assert!(!self.destroyed, "a receive posted to a destroyed queue pair");
        let mut list = ibv_sge { addr: sge.addr, length: sge.len, lkey: sge.lkey };
        let mut wr = ibv_recv_wr { wr_id, next: ptr::null_mut(), sg_list: &mut list, num_sge: 1 };
        let mut bad = ptr::null_mut();
        // SAFETY: live QP; `wr` and `list` outlive the call (the provider
        // copies them); the memory contract is the caller's.
        let ret = unsafe { rdma_sys::ibv_post_recv((*self.id.raw()).qp, &mut wr, &mut bad) };
        if ret != 0 {
            return Err(VerbsError::code("ibv_post_recv", ret));
        }
        Ok(())
    }

    /// Posts `requests` as one chain, in order.
    ///
    /// # Safety
    /// Every SGE must name registered memory that stays valid, and is not
    /// written, until its request completes or the QP is destroyed; remote
    /// addresses and keys must be ones the peer gave for this purpose.
    pub unsafe fn post_send(&mut self, requests: &[SendWr<'_>]) -> Result<(), VerbsError> {
        assert!(!self.destroyed, "a send posted to a destroyed queue pair");
        if requests.is_empty() {
            return Ok(());
        }
        self.wrs.clear();
        self.sges.clear();
        for request in requests {
            assert!(request.sges.len() <= self.caps.send_sge as usize, "more SGEs than the QP takes");
            self.sges.extend(request.sges.iter().map(|s| ibv_sge { addr: s.addr, length: s.len, lkey: s.lkey }));
        }
        let mut sge_at = 0usize;
        for request in requests {
            // SAFETY: ibv_send_wr is plain data; zero is a valid value.
            let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
            wr.wr_id = request.wr_id;
            wr.num_sge = request.sges.len() as i32;
            wr.sg_list = if request.sges.is_empty() {
                ptr::null_mut()
            } else {
                // SAFETY: in bounds of `sges`, which is not resized below.
                unsafe { self.sges.as_mut_ptr().add(sge_at) }
            };
            sge_at += request.sges.len();
            wr.send_flags = if request.signaled { rdma_sys::ibv_send_flags::IBV_SEND_SIGNALED.0 } else { 0 };
            match request.op {
                SendOp::Send => wr.opcode = rdma_sys::ibv_wr_opcode::IBV_WR_SEND,
                SendOp::Write { remote_addr, rkey } => {
                    wr.opcode = rdma_sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                    wr.wr.rdma = rdma_sys::rdma_t { remote_addr, rkey };
                }
                SendOp::WriteWithImm { remote_addr, rkey, imm } => {
                    wr.opcode = rdma_sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                    wr.wr.rdma = rdma_sys::rdma_t { remote_addr, rkey };
                    wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                }
            }
            self.wrs.push(wr);
        }
        let base = self.wrs.as_mut_ptr();
        for index in 1..self.wrs.len() {
            // SAFETY: both indices are in bounds; the vector is not resized
            // while the chain is in use.
            unsafe { (*base.add(index - 1)).next = base.add(index) };
        }
        let mut bad = ptr::null_mut();
        // SAFETY: live QP; the chain and its SGEs outlive the call; the
        // memory contract is the caller's.
        let ret = unsafe { rdma_sys::ibv_post_send((*self.id.raw()).qp, base, &mut bad) };
        self.wrs.clear();
        self.sges.clear();
        if ret != 0 {
            return Err(VerbsError::code("ibv_post_send", ret));
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // The id, CQ and PD are released after the QP by field drops.
        self.destroy();
    }
}
