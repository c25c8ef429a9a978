//! Control protocol between the suite and its peer process: one JSON command per line on the
//! peer's stdin, one JSON reply per line on its stdout. Objects are named by small integer ids
//! the peer hands out.

use serde::{Deserialize, Serialize};

use crate::verbs::{Access, Endpoint, QpState, RemoteAddr, WorkCompletion};

/// A request to the peer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Open device `name` (in the peer's device directory) → [`Reply::Id`].
    Open { name: String },
    /// Allocate a PD on device `dev` → [`Reply::Id`].
    AllocPd { dev: u32 },
    /// Register `len` bytes filled with `fill` → [`Reply::Mr`].
    RegMr {
        dev: u32,
        pd: u32,
        len: usize,
        access: Access,
        fill: u8,
    },
    /// Create an RC QP with its own CQs and move it to INIT with `access` → [`Reply::Qp`].
    CreateQp { dev: u32, pd: u32, access: Access },
    /// Move QP `qp` to RTR towards `remote` → [`Reply::Ok`].
    Rtr { qp: u32, remote: Endpoint },
    /// Move QP `qp` to RTS → [`Reply::Ok`].
    Rts { qp: u32 },
    /// Post a send-queue work request on `qp` → [`Reply::Ok`].
    Post { qp: u32, wr_id: u64, wr: PeerWr },
    /// Post a receive of `len` bytes at `offset` of `mr` → [`Reply::Ok`].
    PostRecv {
        qp: u32,
        wr_id: u64,
        mr: u32,
        offset: usize,
        len: usize,
    },
    /// Wait up to `timeout_ms` for a completion on `qp`'s send (or receive) CQ →
    /// [`Reply::Completion`].
    Poll {
        qp: u32,
        recv: bool,
        timeout_ms: u64,
    },
    /// Bytes of `mr` → [`Reply::Bytes`].
    ReadMr { mr: u32, offset: usize, len: usize },
    /// State of `qp` → [`Reply::State`].
    QpState { qp: u32 },
    /// Drop an object (destroys QPs, deregisters MRs) → [`Reply::Ok`].
    Drop { id: u32 },
    /// CPU time the peer used so far → [`Reply::Usage`].
    Usage,
    /// Start a plain-TCP baseline server (see [`crate::conformance::baseline`]) →
    /// [`Reply::Addr`].
    TcpServe,
}

/// A send-queue work request, naming the peer's own MR as local memory.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum PeerWr {
    /// RDMA WRITE of `len` bytes at `offset` of `mr` to `remote`.
    Write {
        mr: u32,
        offset: usize,
        len: usize,
        remote: RemoteAddr,
    },
    /// RDMA READ of `len` bytes from `remote` into `offset` of `mr`.
    Read {
        mr: u32,
        offset: usize,
        len: usize,
        remote: RemoteAddr,
    },
    /// SEND of `len` bytes at `offset` of `mr`; with `invalidate`, SEND_WITH_INV of that rkey.
    Send {
        mr: u32,
        offset: usize,
        len: usize,
        invalidate: Option<u32>,
    },
}

/// The peer's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// Done.
    Ok,
    /// A new object.
    Id { id: u32 },
    /// A new MR.
    Mr { id: u32, rkey: u32, addr: u64 },
    /// A new QP in INIT.
    Qp {
        id: u32,
        qp_num: u32,
        endpoint: Endpoint,
    },
    /// A completion, or none before the timeout.
    Completion { wc: Option<WorkCompletion> },
    /// Memory contents.
    Bytes { data: Vec<u8> },
    /// A QP state.
    State { state: QpState },
    /// CPU time in microseconds.
    Usage { user_us: u64, system_us: u64 },
    /// A listening address.
    Addr { addr: String },
    /// The command failed.
    Error { message: String },
}
