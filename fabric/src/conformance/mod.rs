//! The conformance suite: the isolation semantics of docs/fabric.md, "The verbs rules every
//! provider keeps" (the MW, PD and access cases of google/rdma-unit-test, ported as semantics,
//! plus the attack cases), written once
//! against [`RdmaDevice`] and run across real processes.
//!
//! Roles: the local process holds a device context on node 1 (the DPU, where tenant workers
//! keep their buffers and windows); a [`Peer`] process holds the "engine" on node 2 and
//! performs the remote accesses, and may open node 1 as another tenant. So most checks run in
//! the local process's responders, and the cross-tenant case's in the peer's.
//!
//! Every case returns `Err(Failure)` instead of panicking, so the check-switch tests can run the
//! suite with one NIC check off and assert that the case named in [`CHECK_WITNESSES`] fails.

pub mod baseline;
mod cases;
mod peer;
mod protocol;

use std::fmt;
use std::time::{Duration, Instant};

pub use peer::{Peer, PeerMr, PeerQp, cpu_time_us, serve};
pub use protocol::{Command, PeerWr, Reply};

use crate::checks::NicChecks;
use crate::error::FabricError;
use crate::provider::{CompletionQueue, MemoryRegion, MemoryWindow, QueuePair, RdmaDevice};
use crate::verbs::{
    Access, MwBind, QpCaps, QpState, QpTransition, RemoteAddr, SendOp, SendWr, WcStatus,
    WorkCompletion,
};

/// Why a case failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<FabricError> for Failure {
    fn from(e: FabricError) -> Failure {
        Failure(e.to_string())
    }
}

impl From<String> for Failure {
    fn from(e: String) -> Failure {
        Failure(e)
    }
}

/// Outcome of one case.
pub type CaseResult = Result<(), Failure>;

/// A case of the suite.
pub type Case<D> = fn(&Env<D>) -> CaseResult;

/// For each NIC check, the case that fails when only that check is switched off: together they
/// prove every check necessary.
pub const CHECK_WITNESSES: [(NicChecks, &str); 7] = [
    (NicChecks::OPCODE, "qp_without_remote_write"),
    (NicChecks::KEY_BYTE, "mw_stale_key_after_rebind"),
    (NicChecks::PD, "mr_on_other_pd"),
    (NicChecks::MW_QP_BINDING, "mw_cross_qp_read"),
    (NicChecks::STATE, "mw_access_after_local_invalidate"),
    (NicChecks::RIGHTS, "mr_missing_remote_write"),
    (NicChecks::BOUNDS, "mw_access_outside_window"),
];

/// Bytes the engine's buffer is filled with; what a successful remote WRITE leaves behind.
pub const ENGINE_FILL: u8 = 0xee;
/// Size of the engine's buffer.
const ENGINE_MR_LEN: usize = 64 * 1024;
/// Where remote READs land in the engine's buffer.
const ENGINE_LANDING: usize = 32 * 1024;

/// The engine side in the peer: a device context on node 2, a PD and a buffer.
#[derive(Clone, Copy, Debug)]
pub struct Engine {
    /// Device id in the peer.
    pub dev: u32,
    /// PD id in the peer.
    pub pd: u32,
    /// The engine's buffer.
    pub mr: PeerMr,
}

/// What every case runs against.
#[derive(Debug)]
pub struct Env<D: RdmaDevice> {
    /// The local device context (node 1).
    pub dev: D,
    /// Name of node 1's device, which the peer can open as another tenant.
    pub node: String,
    /// The peer process.
    pub peer: Peer,
    /// The engine in the peer.
    pub engine: Engine,
    /// Bound on every wait.
    pub timeout: Duration,
}

/// A local QP connected to an engine QP in the peer.
#[derive(Debug)]
pub struct Link<D: RdmaDevice> {
    /// The local QP.
    pub qp: D::Qp,
    /// Its send CQ.
    pub send_cq: D::Cq,
    /// Its receive CQ.
    pub recv_cq: D::Cq,
    /// The peer's QP id.
    pub peer_qp: u32,
}

/// Remote address `offset` bytes into a local MR.
pub fn mr_at<M: MemoryRegion>(mr: &M, offset: u64) -> RemoteAddr {
    RemoteAddr {
        addr: mr.addr() + offset,
        rkey: mr.rkey(),
    }
}

impl<D: RdmaDevice> Env<D> {
    /// Sets up the engine (node 2, `engine_device`) in `peer`. `node` names the device `dev`
    /// was opened on.
    pub fn new(dev: D, node: &str, peer: Peer, engine_device: &str) -> Result<Env<D>, Failure> {
        let edev = peer.open(engine_device)?;
        let pd = peer.alloc_pd(edev)?;
        let mr = peer.reg_mr(
            edev,
            pd,
            ENGINE_MR_LEN,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            ENGINE_FILL,
        )?;
        Ok(Env {
            dev,
            node: node.into(),
            peer,
            engine: Engine { dev: edev, pd, mr },
            timeout: Duration::from_secs(10),
        })
    }

    /// A local QP in `pd` serving `access`, connected to a new engine QP.
    pub fn link(&self, pd: &D::Pd, access: Access) -> Result<Link<D>, Failure> {
        let send_cq = self.dev.create_cq(64)?;
        let recv_cq = self.dev.create_cq(64)?;
        let qp = self
            .dev
            .create_qp(pd, &send_cq, &recv_cq, QpCaps::default())?;
        qp.modify(QpTransition::Init { access })?;
        let remote = self.peer.create_qp(
            self.engine.dev,
            self.engine.pd,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        )?;
        self.peer.rtr(remote.id, &qp.endpoint())?;
        qp.modify(QpTransition::Rtr {
            remote: remote.endpoint,
        })?;
        qp.modify(QpTransition::Rts)?;
        self.peer.rts(remote.id)?;
        Ok(Link {
            qp,
            send_cq,
            recv_cq,
            peer_qp: remote.id,
        })
    }

    /// Registers a local MR.
    pub fn mr(&self, pd: &D::Pd, len: usize, access: Access) -> Result<D::Mr, Failure> {
        Ok(self.dev.reg_mr(pd, len, access)?)
    }

    /// Has the engine QP of `link` perform `wr` and returns its completion status.
    pub fn engine_op(&self, link: &Link<D>, wr: PeerWr) -> Result<WcStatus, Failure> {
        self.peer.post(link.peer_qp, 1, wr)?;
        self.peer_status(link.peer_qp)
    }

    /// Completion status of the next send completion of peer QP `qp`.
    pub fn peer_status(&self, qp: u32) -> Result<WcStatus, Failure> {
        match self.peer.poll(qp, false, self.timeout)? {
            Some(wc) => Ok(wc.status),
            None => Err(Failure("no completion at the engine".into())),
        }
    }

    /// The engine RDMA-WRITEs `len` bytes of its buffer to `remote` through `link`.
    pub fn engine_write(
        &self,
        link: &Link<D>,
        remote: RemoteAddr,
        len: usize,
    ) -> Result<WcStatus, Failure> {
        self.engine_op(
            link,
            PeerWr::Write {
                mr: self.engine.mr.id,
                offset: 0,
                len,
                remote,
            },
        )
    }

    /// The engine RDMA-READs `len` bytes from `remote` through `link` into its landing area.
    pub fn engine_read(
        &self,
        link: &Link<D>,
        remote: RemoteAddr,
        len: usize,
    ) -> Result<WcStatus, Failure> {
        self.engine_op(
            link,
            PeerWr::Read {
                mr: self.engine.mr.id,
                offset: ENGINE_LANDING,
                len,
                remote,
            },
        )
    }

    /// What the engine's last READ brought in.
    pub fn engine_landing(&self, len: usize) -> Result<Vec<u8>, Failure> {
        Ok(self.peer.read_mr(self.engine.mr.id, ENGINE_LANDING, len)?)
    }

    /// The engine SENDs `len` bytes through `link`, invalidating `invalidate` if given.
    pub fn engine_send(
        &self,
        link: &Link<D>,
        len: usize,
        invalidate: Option<u32>,
    ) -> Result<WcStatus, Failure> {
        self.engine_op(
            link,
            PeerWr::Send {
                mr: self.engine.mr.id,
                offset: 0,
                len,
                invalidate,
            },
        )
    }

    /// Waits for a local completion.
    pub fn wait(&self, cq: &D::Cq) -> Result<WorkCompletion, Failure> {
        cq.wait(self.timeout)
            .ok_or_else(|| Failure("no local completion".into()))
    }

    /// Posts a signaled work request on `link` and returns its completion status.
    pub fn local_op(
        &self,
        link: &Link<D>,
        op: SendOp<'_, D::Mr, D::Mw>,
    ) -> Result<WcStatus, Failure> {
        link.qp.post_send(SendWr {
            wr_id: 9,
            op,
            signaled: true,
        })?;
        Ok(self.wait(&link.send_cq)?.status)
    }

    /// Binds `mw` over `[offset, offset + len)` of `mr` through `link` with the key byte of
    /// `rkey`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        link: &Link<D>,
        mw: &D::Mw,
        mr: &D::Mr,
        rkey: u32,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<WcStatus, Failure> {
        self.local_op(
            link,
            SendOp::BindMw(MwBind {
                mw,
                mr,
                rkey,
                addr: mr.addr() + offset,
                len,
                access,
            }),
        )
    }

    /// Invalidates `rkey` through `link`.
    pub fn local_inv(&self, link: &Link<D>, rkey: u32) -> Result<WcStatus, Failure> {
        self.local_op(link, SendOp::LocalInv { rkey })
    }

    /// Waits until the local QP reaches `state`.
    pub fn wait_state(&self, qp: &D::Qp, state: QpState) -> CaseResult {
        let deadline = Instant::now() + self.timeout;
        while qp.state() != state {
            if Instant::now() > deadline {
                return Err(Failure(format!(
                    "local QP in {:?}, expected {state:?}",
                    qp.state()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Waits until peer QP `qp` reaches `state`.
    pub fn wait_peer_state(&self, qp: u32, state: QpState) -> CaseResult {
        let deadline = Instant::now() + self.timeout;
        loop {
            let now = self.peer.qp_state(qp)?;
            if now == state {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Failure(format!("peer QP in {now:?}, expected {state:?}")));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Window address `offset` bytes into the window that starts at `offset_in_mr` of `mr`.
    pub fn window_at(&self, mw: &D::Mw, mr: &D::Mr, offset_in_mr: u64) -> RemoteAddr {
        RemoteAddr {
            addr: mr.addr() + offset_in_mr,
            rkey: mw.rkey(),
        }
    }
}

/// Calls `$callback![case, case, ...]` with the name of every case, so the
/// runtime list and the per-case `#[test]`s come from one list.
#[macro_export]
macro_rules! conformance_cases {
    ($callback:ident) => {
        $callback! {
            mr_write_read_send,
            zero_length_access_skips_key_check,
            mw_bind_and_access,
            mw_rebind_to_different_qp,
            mw_rebind_to_different_rkey,
            mw_cross_qp_invalidate,
            mw_cross_qp_read,
            mw_access_after_local_invalidate,
            mw_stale_key_after_rebind,
            mw_send_with_invalidate,
            mw_send_with_invalidate_wrong_qp,
            mw_dereg_mr_with_bound_window,
            mw_bind_on_qp_in_error,
            mw_zero_length_bind,
            mw_bind_outside_mr,
            mw_bind_needs_mw_bind_flag,
            mw_remote_write_needs_local_write,
            mw_on_other_pd,
            mw_rights_enforced,
            mw_access_outside_window,
            destroy_qp_with_bound_window,
            mr_on_other_pd,
            mr_missing_remote_write,
            mr_missing_remote_read,
            mr_access_out_of_bounds,
            stale_mr_key_after_dereg,
            qp_without_remote_write,
            local_read_target_without_local_write,
            local_sge_of_other_pd,
            send_into_recv_without_local_write,
            recv_too_small,
            error_flushes_later_wrs,
            guessed_rkeys_fail_and_spare_other_tenants,
            cross_tenant_rkey_across_processes,
        }
    };
}

/// Every case, by name.
pub fn cases<D: RdmaDevice>() -> Vec<(&'static str, Case<D>)> {
    macro_rules! list {
        ($($name:ident),* $(,)?) => {
            vec![$((stringify!($name), cases::$name::<D> as Case<D>)),*]
        };
    }
    conformance_cases!(list)
}

/// Runs the one case called `name`; panics if there is no such case (a test naming a case
/// that was removed must fail, not pass vacuously).
pub fn run_case<D: RdmaDevice>(env: &Env<D>, name: &str) -> CaseResult {
    let mut results = run_suite(env, |n| n == name);
    assert_eq!(results.len(), 1, "no case named {name}");
    results.remove(0).1
}

/// Runs the cases whose names pass `filter`, in order, and returns each outcome.
pub fn run_suite<D: RdmaDevice>(
    env: &Env<D>,
    filter: impl Fn(&str) -> bool,
) -> Vec<(&'static str, CaseResult)> {
    cases::<D>()
        .into_iter()
        .filter(|(name, _)| filter(name))
        .map(|(name, case)| (name, case(env)))
        .collect()
}
