//! RC queue pairs: creation, the state machine through `ibv_modify_qp`, endpoints, posting.

use std::os::raw::c_int;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ibverbs_sys as sys;

use super::mr::PdInner;
use super::{
    Ctx, Effect, IbvCq, IbvDevice, IbvMr, Posted, ffi, last_errno, post_error, verbs_error,
};
use crate::error::{FabricError, Result};
use crate::keys::{key_byte, key_index, make_key};
use crate::provider::{QueuePair, RecvWrOf, SendWrOf};
use crate::verbs::{
    Access, Endpoint, QpCaps, QpCounters, QpState, QpTransition, SendOp, Sge, WcOpcode, WcStatus,
};

/// RNR NAK timer the responder advertises (12: 0.64 ms).
const MIN_RNR_TIMER: u8 = 12;
/// Local ACK timeout exponent (14: 4.096 µs × 2¹⁴ ≈ 67 ms).
const ACK_TIMEOUT: u8 = 14;
/// Transport retries before RETRY_EXC_ERR.
const RETRY_CNT: u8 = 7;
/// RNR retries: 7 means forever, so a SEND waits for a receive as on the software provider.
const RNR_RETRY: u8 = 7;
/// GRH hop limit for RoCE and routed InfiniBand.
const HOP_LIMIT: u8 = 64;

/// Tag of the [`Endpoint`] encoding.
const ENDPOINT_TAG: &[u8; 4] = b"ibv1";
/// Length of the encoding: tag, LID, GID, QPN, PSN, MTU.
const ENDPOINT_LEN: usize = 4 + 2 + 16 + 4 + 4 + 1;

/// What a peer needs to connect to a QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WireEndpoint {
    pub lid: u16,
    pub gid: [u8; 16],
    pub qpn: u32,
    pub psn: u32,
    pub mtu: u8,
}

impl WireEndpoint {
    pub fn encode(&self) -> Endpoint {
        let mut b = Vec::with_capacity(ENDPOINT_LEN);
        b.extend_from_slice(ENDPOINT_TAG);
        b.extend_from_slice(&self.lid.to_be_bytes());
        b.extend_from_slice(&self.gid);
        b.extend_from_slice(&self.qpn.to_be_bytes());
        b.extend_from_slice(&self.psn.to_be_bytes());
        b.push(self.mtu);
        Endpoint(b)
    }

    pub fn decode(e: &Endpoint) -> Result<WireEndpoint> {
        let b = &e.0;
        if b.len() != ENDPOINT_LEN || &b[..4] != ENDPOINT_TAG {
            return Err(FabricError::InvalidArgument(format!(
                "not a verbs endpoint ({} bytes; expected {ENDPOINT_LEN} starting with \"ibv1\")",
                b.len()
            )));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut gid = [0; 16];
        gid.copy_from_slice(&b[6..22]);
        Ok(WireEndpoint {
            lid: u16::from_be_bytes([b[4], b[5]]),
            gid,
            qpn: u32_at(22),
            psn: u32_at(26),
            mtu: b[30],
        })
    }
}

/// Counters of one QP (see the module docs of [`super`] for what software can see).
#[derive(Debug, Default)]
pub(crate) struct QpStats {
    bytes_sent: AtomicU64,
    bytes_read: AtomicU64,
    bytes_received: AtomicU64,
    pub remote_access_errors: AtomicU64,
    pub invalid_requests: AtomicU64,
    flushed_wrs: AtomicU64,
}

impl QpStats {
    /// A work request of this QP completed.
    pub fn completed(&self, opcode: WcOpcode, status: WcStatus, bytes: u64) {
        let counter = match (status, opcode) {
            (WcStatus::WrFlushErr, _) => {
                self.flushed_wrs.fetch_add(1, Ordering::Relaxed);
                return;
            }
            (WcStatus::Success, WcOpcode::Send | WcOpcode::RdmaWrite) => &self.bytes_sent,
            (WcStatus::Success, WcOpcode::RdmaRead) => &self.bytes_read,
            (WcStatus::Success, WcOpcode::Recv) => &self.bytes_received,
            _ => return,
        };
        counter.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// An RC queue pair (`ibv_qp` of type `IBV_QPT_RC`). Dropping it destroys it.
#[derive(Debug)]
pub struct IbvQp {
    ctx: Arc<Ctx>,
    _pd: Arc<PdInner>,
    raw: *mut sys::ibv_qp,
    send_cq: IbvCq,
    recv_cq: IbvCq,
    caps: QpCaps,
    qp_num: u32,
    /// Start PSN of this side's send queue.
    psn: u32,
    stats: Arc<QpStats>,
}

// SAFETY: the QP pointer is only passed to thread-safe verbs and destroyed by Drop.
unsafe impl Send for IbvQp {}
// SAFETY: as above.
unsafe impl Sync for IbvQp {}

/// Responder rights a QP can serve (`qp_access_flags`).
const QP_RIGHTS: Access = Access::from_bits_truncate(
    Access::REMOTE_WRITE.bits() | Access::REMOTE_READ.bits() | Access::REMOTE_ATOMIC.bits(),
);

impl IbvQp {
    pub(crate) fn create(
        ctx: &Arc<Ctx>,
        pd: &Arc<PdInner>,
        send_cq: &IbvCq,
        recv_cq: &IbvCq,
        caps: QpCaps,
    ) -> Result<IbvQp> {
        for cq in [send_cq, recv_cq] {
            if !Arc::ptr_eq(&cq.inner.ctx, ctx) {
                return Err(FabricError::InvalidArgument(
                    "completion queue of another device context".into(),
                ));
            }
        }
        let mut attr = sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.raw(),
            recv_cq: recv_cq.raw(),
            srq: ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: caps.max_send_wr.max(1),
                max_recv_wr: caps.max_recv_wr.max(1),
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: valid PD and CQs of this context; attr is fully initialised.
        let raw = unsafe { sys::ibv_create_qp(pd.raw, &mut attr) };
        if raw.is_null() {
            return Err(verbs_error("ibv_create_qp(RC)", last_errno()));
        }
        // SAFETY: ibv_create_qp returned a valid QP.
        let qp_num = unsafe { (*raw).qp_num };
        send_cq.attach(caps.max_send_wr);
        recv_cq.attach(caps.max_recv_wr);
        let stats = Arc::new(QpStats::default());
        ctx.add_qp(qp_num, &stats);
        Ok(IbvQp {
            ctx: ctx.clone(),
            _pd: pd.clone(),
            raw,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            caps,
            qp_num,
            psn: rand::random::<u32>() & 0x00ff_ffff,
            stats,
        })
    }

    fn modify_raw(&self, attr: &mut sys::ibv_qp_attr, mask: sys::ibv_qp_attr_mask) -> c_int {
        // SAFETY: valid QP; attr carries every field `mask` names.
        unsafe { sys::ibv_modify_qp(self.raw, attr, mask.0 as c_int) }
    }

    /// The SGE of `sge`, with its region checked to be of this context.
    fn sge(&self, sge: &Sge<'_, IbvMr>) -> Result<Option<sys::ibv_sge>> {
        if !Arc::ptr_eq(sge.mr.ctx(), &self.ctx) {
            return Err(FabricError::InvalidArgument(
                "memory region of another device context".into(),
            ));
        }
        if sge.len == 0 {
            // mlx5 reads a zero SGE length as 2 GiB: post no SGE instead.
            return Ok(None);
        }
        let length = u32::try_from(sge.len)
            .map_err(|_| FabricError::InvalidArgument(format!("SGE of {} bytes", sge.len)))?;
        let addr = u64::try_from(sge.offset)
            .ok()
            .and_then(|o| crate::MemoryRegion::addr(sge.mr).checked_add(o))
            .ok_or_else(|| FabricError::InvalidArgument("SGE offset overflows".into()))?;
        // Out-of-range SGEs are the device's to refuse (LOC_PROT_ERR), as on any verbs QP.
        Ok(Some(sys::ibv_sge {
            addr,
            length,
            lkey: crate::MemoryRegion::lkey(sge.mr),
        }))
    }
}

/// `qp_state` of a transition.
fn target_state(t: &QpTransition) -> sys::ibv_qp_state::Type {
    use sys::ibv_qp_state as s;
    match t {
        QpTransition::Init { .. } => s::IBV_QPS_INIT,
        QpTransition::Rtr { .. } => s::IBV_QPS_RTR,
        QpTransition::Rts => s::IBV_QPS_RTS,
        QpTransition::Error => s::IBV_QPS_ERR,
        QpTransition::Reset => s::IBV_QPS_RESET,
    }
}

impl QueuePair<IbvDevice> for IbvQp {
    fn qp_num(&self) -> u32 {
        self.qp_num
    }

    fn state(&self) -> QpState {
        use sys::ibv_qp_state as s;
        let mut attr = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        // SAFETY: valid QP and out-pointers.
        let rc = unsafe {
            sys::ibv_query_qp(
                self.raw,
                &mut attr,
                sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int,
                &mut init,
            )
        };
        if rc != 0 {
            tracing::warn!(errno = rc, qp = self.qp_num, "ibv_query_qp failed");
            return QpState::Error;
        }
        match attr.qp_state {
            s::IBV_QPS_RESET => QpState::Reset,
            s::IBV_QPS_INIT => QpState::Init,
            s::IBV_QPS_RTR => QpState::Rtr,
            // Send queue drained: still connected.
            s::IBV_QPS_RTS | s::IBV_QPS_SQD => QpState::Rts,
            _ => QpState::Error,
        }
    }

    fn endpoint(&self) -> Endpoint {
        WireEndpoint {
            lid: self.ctx.lid,
            gid: self.ctx.gid,
            qpn: self.qp_num,
            psn: self.psn,
            mtu: u8::try_from(self.ctx.mtu).unwrap_or(0),
        }
        .encode()
    }

    fn modify(&self, transition: QpTransition) -> Result<()> {
        use sys::ibv_qp_attr_mask as m;
        let mut attr = sys::ibv_qp_attr {
            qp_state: target_state(&transition),
            ..Default::default()
        };
        let mask = match &transition {
            QpTransition::Init { access } => {
                attr.pkey_index = 0;
                attr.port_num = self.ctx.port;
                attr.qp_access_flags =
                    Access::from_bits_truncate(access.bits() & QP_RIGHTS.bits()).bits();
                m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS
            }
            QpTransition::Rtr { remote } => {
                let r = WireEndpoint::decode(remote)?;
                attr.path_mtu = match r.mtu {
                    0 => self.ctx.mtu,
                    mtu => self.ctx.mtu.min(sys::ibv_mtu::from(mtu)),
                };
                attr.dest_qp_num = r.qpn;
                attr.rq_psn = r.psn;
                attr.max_dest_rd_atomic = self.ctx.dest_rd_atomic;
                attr.min_rnr_timer = MIN_RNR_TIMER;
                attr.ah_attr.dlid = r.lid;
                attr.ah_attr.port_num = self.ctx.port;
                if self.ctx.ethernet || r.lid == 0 {
                    attr.ah_attr.is_global = 1;
                    attr.ah_attr.grh.dgid.raw = r.gid;
                    attr.ah_attr.grh.sgid_index = self.ctx.gid_index;
                    attr.ah_attr.grh.hop_limit = HOP_LIMIT;
                }
                m::IBV_QP_STATE
                    | m::IBV_QP_AV
                    | m::IBV_QP_PATH_MTU
                    | m::IBV_QP_DEST_QPN
                    | m::IBV_QP_RQ_PSN
                    | m::IBV_QP_MAX_DEST_RD_ATOMIC
                    | m::IBV_QP_MIN_RNR_TIMER
            }
            QpTransition::Rts => {
                attr.timeout = ACK_TIMEOUT;
                attr.retry_cnt = RETRY_CNT;
                attr.rnr_retry = RNR_RETRY;
                attr.sq_psn = self.psn;
                attr.max_rd_atomic = self.ctx.rd_atomic;
                m::IBV_QP_STATE
                    | m::IBV_QP_TIMEOUT
                    | m::IBV_QP_RETRY_CNT
                    | m::IBV_QP_RNR_RETRY
                    | m::IBV_QP_SQ_PSN
                    | m::IBV_QP_MAX_QP_RD_ATOMIC
            }
            QpTransition::Error | QpTransition::Reset => m::IBV_QP_STATE,
        };
        let rc = self.modify_raw(&mut attr, mask);
        if rc != 0 {
            return Err(match rc.abs() {
                // A refused transition leaves the state as it was.
                libc::EINVAL => FabricError::InvalidTransition {
                    from: self.state(),
                    to: transition.name(),
                },
                errno => verbs_error(&format!("ibv_modify_qp({})", transition.name()), errno),
            });
        }
        if matches!(transition, QpTransition::Reset) {
            // Work requests are discarded without completions.
            self.ctx.forget_qp_work(self.qp_num);
        }
        Ok(())
    }

    fn post_send(&self, wr: SendWrOf<'_, IbvDevice>) -> Result<()> {
        let mut w = sys::ibv_send_wr::default();
        let mut sge: Option<sys::ibv_sge> = None;
        let (opcode, wc_opcode, effect) = match &wr.op {
            SendOp::Send { sge: s } => {
                if let Some(s) = s {
                    sge = self.sge(s)?;
                }
                (
                    sys::ibv_wr_opcode::IBV_WR_SEND,
                    WcOpcode::Send,
                    Effect::None,
                )
            }
            SendOp::SendWithInv {
                sge: s,
                invalidate_rkey,
            } => {
                if let Some(s) = s {
                    sge = self.sge(s)?;
                }
                w.__bindgen_anon_1.invalidate_rkey = *invalidate_rkey;
                (
                    sys::ibv_wr_opcode::IBV_WR_SEND_WITH_INV,
                    WcOpcode::Send,
                    Effect::None,
                )
            }
            SendOp::RdmaWrite { sge: s, remote } => {
                sge = self.sge(s)?;
                w.wr.rdma.remote_addr = remote.addr;
                w.wr.rdma.rkey = remote.rkey;
                (
                    sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                    WcOpcode::RdmaWrite,
                    Effect::None,
                )
            }
            SendOp::RdmaRead { sge: s, remote } => {
                sge = self.sge(s)?;
                w.wr.rdma.remote_addr = remote.addr;
                w.wr.rdma.rkey = remote.rkey;
                (
                    sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
                    WcOpcode::RdmaRead,
                    Effect::None,
                )
            }
            SendOp::BindMw(b) => {
                if !Arc::ptr_eq(b.mw.ctx(), &self.ctx) || !Arc::ptr_eq(b.mr.ctx(), &self.ctx) {
                    return Err(FabricError::InvalidArgument(
                        "window or region of another device context".into(),
                    ));
                }
                // Only the key byte is the consumer's; the index stays the window's.
                let rkey = make_key(key_index(crate::MemoryWindow::rkey(b.mw)), key_byte(b.rkey));
                let rights = Access::REMOTE_READ
                    | Access::REMOTE_WRITE
                    | Access::REMOTE_ATOMIC
                    | Access::ZERO_BASED;
                w.__bindgen_anon_2.bind_mw = sys::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                    mw: b.mw.raw(),
                    rkey,
                    bind_info: sys::ibv_mw_bind_info {
                        mr: b.mr.raw(),
                        addr: b.addr,
                        length: b.len,
                        mw_access_flags: Access::from_bits_truncate(
                            b.access.bits() & rights.bits(),
                        )
                        .bits(),
                    },
                };
                (
                    sys::ibv_wr_opcode::IBV_WR_BIND_MW,
                    WcOpcode::BindMw,
                    Effect::Bind {
                        mw: b.mw.state.clone(),
                        rkey,
                        mr_bound: b.mr.bound.clone(),
                    },
                )
            }
            SendOp::LocalInv { rkey } => {
                w.__bindgen_anon_1.invalidate_rkey = *rkey;
                (
                    sys::ibv_wr_opcode::IBV_WR_LOCAL_INV,
                    WcOpcode::LocalInv,
                    Effect::LocalInv { rkey: *rkey },
                )
            }
        };
        let len = sge.map_or(0, |s| s.length);
        let id = self.ctx.track(Posted {
            wr_id: wr.wr_id,
            qp_num: self.qp_num,
            opcode: wc_opcode,
            len,
            signaled: wr.signaled,
            effect,
        });
        w.wr_id = id;
        w.next = ptr::null_mut();
        w.opcode = opcode;
        // Always signaled: the provider needs every completion (module docs).
        w.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        if let Some(s) = sge.as_mut() {
            w.sg_list = s;
            w.num_sge = 1;
        }
        let mut bad = ptr::null_mut();
        // SAFETY: valid QP; the WR and its SGE live until the call returns (the device copies
        // them); every pointer in the WR (SGE, MW, MR) is valid.
        let rc = unsafe { ffi::dpufs_ibv_post_send(self.raw, &mut w, &mut bad) };
        if rc != 0 {
            self.ctx.untrack(id);
            return Err(post_error("ibv_post_send", rc));
        }
        Ok(())
    }

    fn post_recv(&self, wr: RecvWrOf<'_, IbvDevice>) -> Result<()> {
        let mut sge = match &wr.sge {
            Some(s) => self.sge(s)?,
            None => None,
        };
        let id = self.ctx.track(Posted {
            wr_id: wr.wr_id,
            qp_num: self.qp_num,
            opcode: WcOpcode::Recv,
            len: 0,
            signaled: true,
            effect: Effect::None,
        });
        let mut w = sys::ibv_recv_wr {
            wr_id: id,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
        };
        if let Some(s) = sge.as_mut() {
            w.sg_list = s;
            w.num_sge = 1;
        }
        let mut bad = ptr::null_mut();
        // SAFETY: valid QP; the WR and its SGE live until the call returns.
        let rc = unsafe { ffi::dpufs_ibv_post_recv(self.raw, &mut w, &mut bad) };
        if rc != 0 {
            self.ctx.untrack(id);
            return Err(post_error("ibv_post_recv", rc));
        }
        Ok(())
    }

    fn counters(&self) -> QpCounters {
        self.ctx.drain_events();
        let s = &self.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        QpCounters {
            bytes_sent: get(&s.bytes_sent),
            bytes_read: get(&s.bytes_read),
            bytes_received: get(&s.bytes_received),
            bytes_served: 0,
            remote_access_errors: get(&s.remote_access_errors),
            invalid_requests: get(&s.invalid_requests),
            flushed_wrs: get(&s.flushed_wrs),
        }
    }
}

impl Drop for IbvQp {
    fn drop(&mut self) {
        // SAFETY: the QP came from ibv_create_qp and is destroyed once; its async events are
        // acknowledged as soon as they are read, so this does not block on them.
        let rc = unsafe { sys::ibv_destroy_qp(self.raw) };
        if rc != 0 {
            tracing::error!(errno = rc, qp = self.qp_num, "ibv_destroy_qp failed");
        }
        self.ctx.forget_qp_work(self.qp_num);
        self.ctx.remove_qp(self.qp_num, &self.stats);
        self.send_cq.detach(self.caps.max_send_wr);
        self.recv_cq.detach(self.caps.max_recv_wr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trip_and_foreign_endpoints() {
        let e = WireEndpoint {
            lid: 0x1234,
            gid: [7; 16],
            qpn: 0x00ab_cdef,
            psn: 0x0012_3456,
            mtu: 3,
        };
        let encoded = e.encode();
        assert_eq!(encoded.0.len(), ENDPOINT_LEN);
        assert_eq!(WireEndpoint::decode(&encoded).unwrap(), e);
        for bad in [Endpoint(vec![]), Endpoint(b"soft-endpoint".to_vec())] {
            assert!(matches!(
                WireEndpoint::decode(&bad),
                Err(FabricError::InvalidArgument(_))
            ));
        }
    }
}
