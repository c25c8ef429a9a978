//! Plain data types shared by every provider: access flags, QP states and transitions, work
//! requests, completions, async events and counters. They follow libibverbs names so the
//! verbs provider is a direct mapping.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

use serde::{Deserialize, Serialize};

/// Access flags of an MR (`ibv_reg_mr`), of a window binding (`ibv_mw_bind_info.mw_access_flags`)
/// and of a QP (`qp_access_flags`, only the remote bits matter there).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Access(u32);

impl Access {
    /// No access beyond local read (which is always allowed).
    pub const NONE: Access = Access(0);
    /// The device may write the memory: receives, READ responses landing here.
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA WRITE.
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    /// Peers may RDMA READ.
    pub const REMOTE_READ: Access = Access(1 << 2);
    /// Peers may use atomics. dpufs never grants it; kept so the C10-74 rule is complete.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// Memory windows may be bound over this MR (C10-73).
    pub const MW_BIND: Access = Access(1 << 4);
    /// Remote addresses are offsets from the start of the MR or window, not virtual addresses.
    pub const ZERO_BASED: Access = Access(1 << 5);
    const ALL: u32 = (1 << 6) - 1;
    const NAMES: [(Access, &'static str); 6] = [
        (Access::LOCAL_WRITE, "LOCAL_WRITE"),
        (Access::REMOTE_WRITE, "REMOTE_WRITE"),
        (Access::REMOTE_READ, "REMOTE_READ"),
        (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        (Access::MW_BIND, "MW_BIND"),
        (Access::ZERO_BASED, "ZERO_BASED"),
    ];

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Flags from raw bits; unknown bits are dropped.
    pub const fn from_bits_truncate(bits: u32) -> Access {
        Access(bits & Self::ALL)
    }

    /// Whether every flag of `other` is set here.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any flag of `other` is set here.
    pub const fn intersects(self, other: Access) -> bool {
        self.0 & other.0 != 0
    }

    /// These flags without those of `other`.
    pub const fn without(self, other: Access) -> Access {
        Access(self.0 & !other.0)
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Self::NAMES
            .iter()
            .filter(|(flag, _)| self.contains(*flag))
            .map(|(_, name)| *name)
            .collect();
        if names.is_empty() {
            f.write_str("NONE")
        } else {
            f.write_str(&names.join("|"))
        }
    }
}

/// Queue pair states of the verbs state machine (`enum ibv_qp_state`, the RC subset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum QpState {
    /// Created; nothing can be posted.
    Reset,
    /// Access flags set; receives may be posted.
    Init,
    /// Ready to receive: the peer is known, incoming requests are served.
    Rtr,
    /// Ready to send.
    Rts,
    /// Broken; every posted work request completes with `WrFlushErr`.
    Error,
}

/// Connection data a QP publishes for its peer (LID/GID, QP number and start PSN on verbs),
/// exchanged out of band exactly as verbs applications exchange them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint(pub Vec<u8>);

/// A transition for [`QueuePair::modify`](crate::QueuePair::modify) (`ibv_modify_qp`).
#[derive(Clone, Debug)]
pub enum QpTransition {
    /// RESET → INIT with the responder access flags (remote read/write/atomic).
    Init {
        /// Which remote operations this QP serves at all (responder check 1, docs/fabric.md).
        access: Access,
    },
    /// INIT → RTR, naming the peer QP.
    Rtr {
        /// The peer's [`QueuePair::endpoint`](crate::QueuePair::endpoint).
        remote: Endpoint,
    },
    /// RTR → RTS.
    Rts,
    /// Any state → ERROR: outstanding and later work requests are flushed.
    Error,
    /// Any state → RESET: work requests are discarded without completions.
    Reset,
}

impl QpTransition {
    /// Short name for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            QpTransition::Init { .. } => "INIT",
            QpTransition::Rtr { .. } => "RTR",
            QpTransition::Rts => "RTS",
            QpTransition::Error => "ERROR",
            QpTransition::Reset => "RESET",
        }
    }
}

/// Sizes of a new QP (`ibv_qp_init_attr.cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests.
    pub max_recv_wr: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
        }
    }
}

/// A scatter/gather element: `len` bytes at `offset` inside a registered region (on verbs:
/// `addr = mr.addr + offset`, `lkey = mr.lkey`). Naming the MR, not a raw lkey, keeps the memory
/// alive; using an MR of another PD still fails with `LocProtErr`, as a foreign lkey does.
#[derive(Debug)]
pub struct Sge<'a, M> {
    /// The region.
    pub mr: &'a M,
    /// Byte offset into the region.
    pub offset: usize,
    /// Number of bytes.
    pub len: usize,
}

impl<M> Clone for Sge<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for Sge<'_, M> {}

/// Remote memory named by an RDMA READ/WRITE: address in the rkey's address space and the rkey.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteAddr {
    /// Virtual address (or offset, for zero-based regions and windows).
    pub addr: u64,
    /// Remote key of an MR or a memory window.
    pub rkey: u32,
}

/// Binding of a type-2 memory window (`ibv_mw_bind_info` plus the WR's new rkey).
#[derive(Debug)]
pub struct MwBind<'a, M, W> {
    /// The window.
    pub mw: &'a W,
    /// The region the window covers part of.
    pub mr: &'a M,
    /// New rkey; only its key byte (low 8 bits) is used, the index stays the window's.
    /// Use [`inc_rkey`](crate::inc_rkey) on the window's current rkey.
    pub rkey: u32,
    /// Start, in the MR's address space.
    pub addr: u64,
    /// Length; zero is an error for type-2 windows.
    pub len: u64,
    /// Remote rights granted through the window (plus [`Access::ZERO_BASED`]).
    pub access: Access,
}

/// The operation of a send-queue work request (`ibv_wr_opcode`).
#[derive(Debug)]
pub enum SendOp<'a, M, W> {
    /// Two-sided send; consumes a receive at the peer.
    Send {
        /// Payload, if any.
        sge: Option<Sge<'a, M>>,
    },
    /// Send that also invalidates a type-2 window at the peer.
    SendWithInv {
        /// Payload, if any.
        sge: Option<Sge<'a, M>>,
        /// rkey of the peer's window to invalidate.
        invalidate_rkey: u32,
    },
    /// One-sided write of the local `sge` to remote memory.
    RdmaWrite {
        /// Local source.
        sge: Sge<'a, M>,
        /// Remote destination.
        remote: RemoteAddr,
    },
    /// One-sided read of remote memory into the local `sge` (which needs LOCAL_WRITE).
    RdmaRead {
        /// Local destination.
        sge: Sge<'a, M>,
        /// Remote source.
        remote: RemoteAddr,
    },
    /// Bind a type-2 window to this QP.
    BindMw(MwBind<'a, M, W>),
    /// Invalidate a type-2 window bound through this QP.
    LocalInv {
        /// The window's current rkey.
        rkey: u32,
    },
}

impl<'a, M, W> SendOp<'a, M, W> {
    /// An RDMA WRITE of `sge` to `remote` (`write`), or an RDMA READ of `remote` into `sge`.
    pub fn rdma(write: bool, sge: Sge<'a, M>, remote: RemoteAddr) -> Self {
        if write {
            SendOp::RdmaWrite { sge, remote }
        } else {
            SendOp::RdmaRead { sge, remote }
        }
    }
}

/// A send-queue work request (`ibv_send_wr`).
#[derive(Debug)]
pub struct SendWr<'a, M, W> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp<'a, M, W>,
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug)]
pub struct RecvWr<'a, M> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where the incoming payload lands; needs LOCAL_WRITE.
    pub sge: Option<Sge<'a, M>>,
}

/// Completion status (`enum ibv_wc_status`, the subset RC over this model can produce).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WcStatus {
    /// Done.
    Success,
    /// A receive buffer was too small for the incoming send.
    LocLenErr,
    /// The local side's own memory check failed: lkey of another PD, range outside the MR,
    /// missing LOCAL_WRITE on a READ target or receive buffer.
    LocProtErr,
    /// The QP was in, or went to, ERROR before this request completed.
    WrFlushErr,
    /// A window bind or local invalidation broke a rule (C10-72..75, rebind, other QP).
    MwBindErr,
    /// The responder rejected the request as invalid (QP lacks the remote right, bad
    /// SEND_WITH_INV key, receive too small).
    RemInvReqErr,
    /// The responder's key, PD, window, state, rights or bounds check failed.
    RemAccessErr,
    /// The responder failed locally (e.g. receive buffer lacks LOCAL_WRITE).
    RemOpErr,
    /// The transport broke (peer gone, connection lost, sequence error).
    RetryExcErr,
}

/// Kind of completed work request (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WcOpcode {
    /// SEND or SEND_WITH_INV.
    Send,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA READ.
    RdmaRead,
    /// BIND_MW.
    BindMw,
    /// LOCAL_INV.
    LocalInv,
    /// A receive.
    Recv,
}

/// A work completion (`struct ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receives) or moved (READ/WRITE/SEND).
    pub byte_len: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// For receives of SEND_WITH_INV: the rkey that was invalidated here.
    pub invalidated_rkey: Option<u32>,
}

/// Asynchronous events (`ibv_get_async_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AsyncEvent {
    /// The QP went to ERROR because the transport broke or a local error occurred
    /// (`IBV_EVENT_QP_FATAL`).
    QpFatal {
        /// QP number.
        qp_num: u32,
    },
    /// This QP, as responder, received a request that failed an access check
    /// (`IBV_EVENT_QP_ACCESS_ERR`): a probe or a stale handle.
    QpAccessErr {
        /// QP number.
        qp_num: u32,
    },
    /// This QP, as responder, received an invalid request (`IBV_EVENT_QP_REQ_ERR`).
    QpReqErr {
        /// QP number.
        qp_num: u32,
    },
}

/// Per-QP counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpCounters {
    /// Payload bytes this QP sent as requester (SEND, WRITE).
    pub bytes_sent: u64,
    /// Payload bytes this QP fetched as requester (READ).
    pub bytes_read: u64,
    /// Payload bytes peers wrote or sent into this QP's memory as responder.
    pub bytes_received: u64,
    /// Payload bytes peers read through this QP as responder.
    pub bytes_served: u64,
    /// Requests this QP rejected as responder with a remote access error.
    pub remote_access_errors: u64,
    /// Requests this QP rejected as responder as invalid.
    pub invalid_requests: u64,
    /// Work requests completed with `WrFlushErr`.
    pub flushed_wrs: u64,
}

/// Device-wide counters (port counters on an HCA; shared by all processes on the software device).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCounters {
    /// Responder-side remote access errors (`resp_remote_access_errors`).
    pub remote_access_errors: u64,
    /// Responder-side invalid requests.
    pub invalid_requests: u64,
    /// Window binds that failed.
    pub bind_errors: u64,
    /// QPs that went to ERROR.
    pub qp_errors: u64,
}
