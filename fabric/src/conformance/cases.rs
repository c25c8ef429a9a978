// Over 600 lines: the conformance cases are one list, run in order against every provider.
//! The cases. Each sets up its own PDs, MRs, windows and connections, so cases are independent;
//! each returns at the first deviation with what it expected and what it saw.
//!
//! Names follow rdma-unit-test where a case ports one (MwType2 Bind / RebindToDifferentQp /
//! RebindToDifferentRKey / CrossQpInvalidate / CrossQpRead / DeregMrWhenBound; Pd MrOnOtherPd /
//! MwOnOtherPd; RdmaAccess Missing*).

use super::{CaseResult, ENGINE_FILL, Env, Failure, Link, PeerWr, mr_at};
use crate::error::{DeregError, FabricError};
use crate::keys::{inc_rkey, key_byte, key_index, make_key};
use crate::provider::{MemoryRegion, MemoryWindow, QueuePair, RdmaDevice};
use crate::verbs::{
    Access, AsyncEvent, QpState, RecvWr, RemoteAddr, SendOp, Sge, WcOpcode, WcStatus,
};

const PAGE: usize = 4096;
const P: u64 = PAGE as u64;

/// Remote rights a QP serves in most cases.
const QP_RW: Access =
    Access::from_bits_truncate(Access::REMOTE_WRITE.bits() | Access::REMOTE_READ.bits());
/// An MR peers may read and write.
const MR_RW: Access = Access::from_bits_truncate(
    Access::LOCAL_WRITE.bits() | Access::REMOTE_WRITE.bits() | Access::REMOTE_READ.bits(),
);
/// An MR for windows only: no remote rights of its own.
const MR_WINDOWS: Access =
    Access::from_bits_truncate(Access::LOCAL_WRITE.bits() | Access::MW_BIND.bits());

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(Failure(format!($($fmt)+)));
        }
    };
}

fn expect(got: WcStatus, want: WcStatus, what: &str) -> CaseResult {
    ensure!(got == want, "{what}: expected {want:?}, got {got:?}");
    Ok(())
}

/// Local MR contents.
fn bytes<M: MemoryRegion>(mr: &M, offset: usize, len: usize) -> Result<Vec<u8>, Failure> {
    let mut out = vec![0; len];
    // SAFETY: the cases run on one thread; their work requests have completed.
    unsafe { mr.read_at(offset, &mut out)? };
    Ok(out)
}

fn all(data: &[u8], value: u8) -> bool {
    data.iter().all(|&b| b == value)
}

/// The same key with another key byte.
fn other_key_byte(key: u32) -> u32 {
    make_key(key_index(key), key_byte(key).wrapping_add(0x80))
}

/// A fresh window bound through `link` over `[offset, offset+len)` of `mr`; returns its rkey.
fn bound_window<D: RdmaDevice>(
    env: &Env<D>,
    link: &Link<D>,
    pd: &D::Pd,
    mr: &D::Mr,
    offset: u64,
    len: u64,
    access: Access,
) -> Result<(D::Mw, u32), Failure> {
    let mw = env.dev.alloc_mw(pd)?;
    let rkey = inc_rkey(mw.rkey());
    expect(
        env.bind(link, &mw, mr, rkey, offset, len, access)?,
        WcStatus::Success,
        "bind",
    )?;
    ensure!(
        mw.rkey() == rkey,
        "window rkey {:#x} after bind, expected {rkey:#x}",
        mw.rkey()
    );
    Ok((mw, rkey))
}

/// WRITE, READ and SEND through a plain MR, with the data checked at both ends.
pub fn mr_write_read_send<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 4 * PAGE, MR_RW)?;
    let link = env.link(&pd, QP_RW)?;
    expect(
        env.engine_write(&link, mr_at(&mr, 0), PAGE)?,
        WcStatus::Success,
        "WRITE",
    )?;
    ensure!(
        all(&bytes(&mr, 0, PAGE)?, ENGINE_FILL),
        "WRITE did not land"
    );
    ensure!(
        all(&bytes(&mr, PAGE, PAGE)?, 0),
        "WRITE landed beyond its range"
    );
    let pattern: Vec<u8> = (0..PAGE).map(|i| (i % 251) as u8).collect();
    // SAFETY: one thread; nothing is posted on the region.
    unsafe { mr.write_at(PAGE, &pattern)? };
    expect(
        env.engine_read(&link, mr_at(&mr, P), PAGE)?,
        WcStatus::Success,
        "READ",
    )?;
    ensure!(
        env.engine_landing(PAGE)? == pattern,
        "READ returned other bytes"
    );
    link.qp.post_recv(RecvWr {
        wr_id: 7,
        sge: Some(Sge {
            mr: &mr,
            offset: 2 * PAGE,
            len: PAGE,
        }),
    })?;
    expect(
        env.engine_send(&link, 100, None)?,
        WcStatus::Success,
        "SEND",
    )?;
    let wc = env.wait(&link.recv_cq)?;
    ensure!(
        wc.status == WcStatus::Success
            && wc.wr_id == 7
            && wc.byte_len == 100
            && wc.opcode == WcOpcode::Recv,
        "receive completion {wc:?}"
    );
    ensure!(
        all(&bytes(&mr, 2 * PAGE, 100)?, ENGINE_FILL),
        "SEND payload missing"
    );
    Ok(())
}

/// Responder check 2: a zero-length READ/WRITE skips the key checks.
pub fn zero_length_access_skips_key_check<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let link = env.link(&pd, QP_RW)?;
    let nowhere = RemoteAddr {
        addr: 0xdead_0000,
        rkey: 0x00ff_ff42,
    };
    expect(
        env.engine_write(&link, nowhere, 0)?,
        WcStatus::Success,
        "zero-length WRITE",
    )?;
    expect(
        env.engine_read(&link, nowhere, 0)?,
        WcStatus::Success,
        "zero-length READ",
    )
}

/// MwType2 Bind: a bound window gives exactly its range and rights, with the consumer's key byte.
pub fn mw_bind_and_access<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 4 * PAGE, MR_WINDOWS)?;
    let link = env.link(&pd, QP_RW)?;
    let (mw, _) = bound_window(env, &link, &pd, &mr, P, 2 * P, QP_RW)?;
    let window = env.window_at(&mw, &mr, P);
    expect(
        env.engine_write(&link, window, 2 * PAGE)?,
        WcStatus::Success,
        "WRITE through the window",
    )?;
    ensure!(
        all(&bytes(&mr, PAGE, 2 * PAGE)?, ENGINE_FILL),
        "WRITE did not land"
    );
    ensure!(
        all(&bytes(&mr, 0, PAGE)?, 0) && all(&bytes(&mr, 3 * PAGE, PAGE)?, 0),
        "WRITE landed outside the window"
    );
    expect(
        env.engine_read(&link, window, PAGE)?,
        WcStatus::Success,
        "READ through the window",
    )
}

/// MwType2 RebindToDifferentQp: a bound type-2 window cannot be bound again through another QP.
pub fn mw_rebind_to_different_qp<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, MR_WINDOWS)?;
    let link1 = env.link(&pd, QP_RW)?;
    let link2 = env.link(&pd, QP_RW)?;
    let (mw, rkey) = bound_window(env, &link1, &pd, &mr, 0, P, QP_RW)?;
    let again = env.bind(&link2, &mw, &mr, inc_rkey(rkey), 0, P, QP_RW)?;
    expect(again, WcStatus::MwBindErr, "rebind through another QP")?;
    env.wait_state(&link2.qp, QpState::Error)?;
    ensure!(mw.rkey() == rkey, "failed rebind changed the rkey");
    expect(
        env.engine_write(&link1, env.window_at(&mw, &mr, 0), 64)?,
        WcStatus::Success,
        "the original binding after the failed rebind",
    )
}

/// MwType2 RebindToDifferentRKey: nor through the same QP with a new key byte.
pub fn mw_rebind_to_different_rkey<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, MR_WINDOWS)?;
    let link = env.link(&pd, QP_RW)?;
    let (mw, rkey) = bound_window(env, &link, &pd, &mr, 0, P, QP_RW)?;
    let again = env.bind(&link, &mw, &mr, inc_rkey(rkey), 0, P, QP_RW)?;
    expect(again, WcStatus::MwBindErr, "rebind with another key byte")?;
    env.wait_state(&link.qp, QpState::Error)
}

/// MwType2 CrossQpInvalidate: only the binding QP may invalidate.
pub fn mw_cross_qp_invalidate<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, MR_WINDOWS)?;
    let link1 = env.link(&pd, QP_RW)?;
    let link2 = env.link(&pd, QP_RW)?;
    let (mw, rkey) = bound_window(env, &link1, &pd, &mr, 0, P, QP_RW)?;
    expect(
        env.local_inv(&link2, rkey)?,
        WcStatus::MwBindErr,
        "LOCAL_INV through another QP",
    )?;
    env.wait_state(&link2.qp, QpState::Error)?;
    expect(
        env.engine_write(&link1, env.window_at(&mw, &mr, 0), 64)?,
        WcStatus::Success,
        "window still bound after the refused invalidation",
    )
}

/// MwType2 CrossQpRead: a window is usable only through the QP it is bound to; the failure kills
/// the offending connection (both QPs) and spares the binding one.
pub fn mw_cross_qp_read<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, MR_WINDOWS)?;
    let link1 = env.link(&pd, QP_RW)?;
    let link2 = env.link(&pd, QP_RW)?;
    let (mw, _) = bound_window(env, &link1, &pd, &mr, 0, P, Access::REMOTE_READ)?;
    let window = env.window_at(&mw, &mr, 0);
    expect(
        env.engine_read(&link2, window, 64)?,
        WcStatus::RemAccessErr,
        "READ through another QP",
    )?;
    env.wait_state(&link2.qp, QpState::Error)?;
    env.wait_peer_state(link2.peer_qp, QpState::Error)?;
    expect(
        env.engine_read(&link1, window, 64)?,
        WcStatus::Success,
        "READ through the bound QP",
    )?;
    ensure!(
        link1.qp.state() == QpState::Rts,
        "the bound QP was disturbed"
    );
    Ok(())
}

/// Stale handle after invalidation: LOCAL_INV makes the window FREE; a late access through the
/// very same QP with the very same key fails (only the state check stops it).
pub fn mw_access_after_local_invalidate<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, MR_WINDOWS)?;
    let link = env.link(&pd, QP_RW)?;
    let (mw, rkey) = bound_window(env, &link, &pd, &mr, 0, P, QP_RW)?;
    let window = env.window_at(&mw, &mr, 0);
    expect(
        env.engine_read(&link, window, 64)?,
        WcStatus::Success,
        "READ while bound",
    )?;
    expect(env.local_inv(&link, rkey)?, WcStatus::Success, "LOCAL_INV")?;
    expect(
        env.engine_write(&link, window, 64)?,
        WcStatus::RemAccessErr,
        "WRITE after invalidation",
    )?;
    ensure!(all(&bytes(&mr, 0, 64)?, 0), "late WRITE landed");
    env.wait_state(&link.qp, QpState::Error)
}

/// Replay after rotation: the rkey of a previous binding of the same window (same index, same
/// QP, range and rights) fails once the window is rebound with a new key byte.
pub fn mw_stale_key_after_rebind<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, MR_WINDOWS)?;
    let link = env.link(&pd, QP_RW)?;
    let (mw, old) = bound_window(env, &link, &pd, &mr, 0, P, QP_RW)?;
    expect(env.local_inv(&link, old)?, WcStatus::Success, "LOCAL_INV")?;
    let new = inc_rkey(old);
    expect(
        env.bind(&link, &mw, &mr, new, 0, P, QP_RW)?,
        WcStatus::Success,
        "rebind after invalidation",
    )?;
    let at = |rkey| RemoteAddr {
        addr: mr.addr(),
        rkey,
    };
    expect(
        env.engine_read(&link, at(new), 64)?,
        WcStatus::Success,
        "READ with the new key",
    )?;
    expect(
        env.engine_write(&link, at(old), 64)?,
        WcStatus::RemAccessErr,
        "WRITE with the old key",
    )?;
    ensure!(all(&bytes(&mr, 0, 64)?, 0), "replayed WRITE landed");
    Ok(())
}

/// SEND_WITH_INV invalidates the named window at the responder; a later access fails.
pub fn mw_send_with_invalidate<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, MR_WINDOWS)?;
    let link = env.link(&pd, QP_RW)?;
    let (mw, rkey) = bound_window(env, &link, &pd, &mr, 0, P, QP_RW)?;
    link.qp.post_recv(RecvWr {
        wr_id: 3,
        sge: Some(Sge {
            mr: &mr,
            offset: PAGE,
            len: 64,
        }),
    })?;
    expect(
        env.engine_send(&link, 16, Some(rkey))?,
        WcStatus::Success,
        "SEND_WITH_INV",
    )?;
    let wc = env.wait(&link.recv_cq)?;
    ensure!(
        wc.status == WcStatus::Success && wc.invalidated_rkey == Some(rkey),
        "receive completion {wc:?}"
    );
    let window = env.window_at(&mw, &mr, 0);
    expect(
        env.engine_write(&link, window, 64)?,
        WcStatus::RemAccessErr,
        "WRITE after remote invalidation",
    )
}

/// SEND_WITH_INV naming a window bound to another QP is an invalid request (class J).
pub fn mw_send_with_invalidate_wrong_qp<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, MR_WINDOWS)?;
    let link1 = env.link(&pd, QP_RW)?;
    let link2 = env.link(&pd, QP_RW)?;
    let (mw, rkey) = bound_window(env, &link1, &pd, &mr, 0, P, QP_RW)?;
    link2.qp.post_recv(RecvWr {
        wr_id: 4,
        sge: Some(Sge {
            mr: &mr,
            offset: PAGE,
            len: 64,
        }),
    })?;
    expect(
        env.engine_send(&link2, 16, Some(rkey))?,
        WcStatus::RemInvReqErr,
        "SEND_WITH_INV on another QP",
    )?;
    expect(
        env.wait(&link2.recv_cq)?.status,
        WcStatus::RemInvReqErr,
        "responder's receive",
    )?;
    env.wait_state(&link2.qp, QpState::Error)?;
    expect(
        env.engine_write(&link1, env.window_at(&mw, &mr, 0), 64)?,
        WcStatus::Success,
        "window still bound",
    )
}

/// MwType2 DeregMrWhenBound: EBUSY while a window is bound; fine after invalidation.
pub fn mw_dereg_mr_with_bound_window<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, MR_WINDOWS)?;
    let link = env.link(&pd, QP_RW)?;
    let (_mw, rkey) = bound_window(env, &link, &pd, &mr, 0, P, QP_RW)?;
    let mr = match env.dev.dereg_mr(mr) {
        Err(DeregError {
            mr,
            error: FabricError::Busy(_),
        }) => mr,
        Err(DeregError { error, .. }) => return Err(Failure(format!("dereg failed with {error}"))),
        Ok(()) => return Err(Failure("deregistered an MR with a bound window".into())),
    };
    expect(env.local_inv(&link, rkey)?, WcStatus::Success, "LOCAL_INV")?;
    env.dev
        .dereg_mr(mr)
        .map_err(|e| Failure(format!("dereg after invalidation: {e}")))
}

/// Binding through a QP in ERROR is flushed and leaves the window untouched.
pub fn mw_bind_on_qp_in_error<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, MR_WINDOWS)?;
    let dead = env.link(&pd, QP_RW)?;
    dead.qp.modify(crate::QpTransition::Error)?;
    let mw = env.dev.alloc_mw(&pd)?;
    let rkey = inc_rkey(mw.rkey());
    expect(
        env.bind(&dead, &mw, &mr, rkey, 0, P, QP_RW)?,
        WcStatus::WrFlushErr,
        "bind on a QP in ERROR",
    )?;
    let live = env.link(&pd, QP_RW)?;
    expect(
        env.bind(&live, &mw, &mr, rkey, 0, P, QP_RW)?,
        WcStatus::Success,
        "bind after the flushed one",
    )
}

/// o10-37.2.40: a zero-length type-2 bind is an error.
pub fn mw_zero_length_bind<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    bind_refused(env, MR_WINDOWS, 0, 0, QP_RW, false)
}

/// C10-75: the window must lie inside the MR.
pub fn mw_bind_outside_mr<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    bind_refused(env, MR_WINDOWS, P, 2 * P, QP_RW, false)
}

/// C10-73: the MR must allow MW_BIND.
pub fn mw_bind_needs_mw_bind_flag<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    bind_refused(env, MR_RW, 0, P, QP_RW, false)
}

/// C10-74: a window with remote write needs LOCAL_WRITE on the MR.
pub fn mw_remote_write_needs_local_write<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let mr_access = Access::MW_BIND | Access::REMOTE_READ;
    bind_refused(env, mr_access, 0, P, Access::REMOTE_WRITE, false)?;
    // The same MR takes a read-only window.
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, mr_access)?;
    let link = env.link(&pd, QP_RW)?;
    bound_window(env, &link, &pd, &mr, 0, P, Access::REMOTE_READ).map(drop)
}

/// Pd MwOnOtherPd (C10-72): a window binds only through a QP of its own PD.
pub fn mw_on_other_pd<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    bind_refused(env, MR_WINDOWS, 0, P, QP_RW, true)
}

/// Binds a window of `len` at `offset` over a 2-page MR with `mr_access` (the window in another
/// PD when `other_pd`) and expects MW_BIND_ERR and the QP in ERROR.
fn bind_refused<D: RdmaDevice>(
    env: &Env<D>,
    mr_access: Access,
    offset: u64,
    len: u64,
    access: Access,
    other_pd: bool,
) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let other = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, mr_access)?;
    let link = env.link(&pd, QP_RW)?;
    let mw = env.dev.alloc_mw(if other_pd { &other } else { &pd })?;
    let status = env.bind(&link, &mw, &mr, inc_rkey(mw.rkey()), offset, len, access)?;
    expect(status, WcStatus::MwBindErr, "bind")?;
    env.wait_state(&link.qp, QpState::Error)
}

/// A window grants only its rights: WRITE through a read-only window fails.
pub fn mw_rights_enforced<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, MR_WINDOWS)?;
    let link = env.link(&pd, QP_RW)?;
    let (mw, _) = bound_window(env, &link, &pd, &mr, 0, P, Access::REMOTE_READ)?;
    let window = env.window_at(&mw, &mr, 0);
    expect(
        env.engine_write(&link, window, 64)?,
        WcStatus::RemAccessErr,
        "WRITE through a read-only window",
    )?;
    ensure!(all(&bytes(&mr, 0, 64)?, 0), "refused WRITE landed");
    Ok(())
}

/// A window grants only its range: a WRITE just past its end, still inside the MR, fails.
pub fn mw_access_outside_window<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 4 * PAGE, MR_WINDOWS)?;
    let link = env.link(&pd, QP_RW)?;
    let (mw, _) = bound_window(env, &link, &pd, &mr, P, P, QP_RW)?;
    let past_end = env.window_at(&mw, &mr, 2 * P);
    expect(
        env.engine_write(&link, past_end, 64)?,
        WcStatus::RemAccessErr,
        "WRITE past the window",
    )?;
    ensure!(
        all(&bytes(&mr, 2 * PAGE, 64)?, 0),
        "WRITE past the window landed"
    );
    Ok(())
}

/// Destroying a QP with a bound window is allowed; the window is then useless, and dealloc plus
/// dereg still work.
pub fn destroy_qp_with_bound_window<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, 2 * PAGE, MR_WINDOWS)?;
    let link1 = env.link(&pd, QP_RW)?;
    let link2 = env.link(&pd, QP_RW)?;
    let (mw, _) = bound_window(env, &link1, &pd, &mr, 0, P, QP_RW)?;
    let window = env.window_at(&mw, &mr, 0);
    drop(link1);
    expect(
        env.engine_write(&link2, window, 64)?,
        WcStatus::RemAccessErr,
        "WRITE through an orphaned window",
    )?;
    env.dev.dealloc_mw(mw)?;
    env.dev
        .dereg_mr(mr)
        .map_err(|e| Failure(format!("dereg after dealloc: {e}")))
}

/// Pd MrOnOtherPd: an MR is reachable only through QPs of its PD.
pub fn mr_on_other_pd<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let other = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, PAGE, MR_RW)?;
    let link = env.link(&other, QP_RW)?;
    expect(
        env.engine_write(&link, mr_at(&mr, 0), 64)?,
        WcStatus::RemAccessErr,
        "WRITE through another PD's QP",
    )?;
    ensure!(all(&bytes(&mr, 0, 64)?, 0), "WRITE from another PD landed");
    env.wait_state(&link.qp, QpState::Error)
}

/// RdmaAccess MissingRemoteWrite.
pub fn mr_missing_remote_write<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, PAGE, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
    let link = env.link(&pd, QP_RW)?;
    expect(
        env.engine_write(&link, mr_at(&mr, 0), 64)?,
        WcStatus::RemAccessErr,
        "WRITE without REMOTE_WRITE",
    )?;
    ensure!(
        all(&bytes(&mr, 0, 64)?, 0),
        "WRITE without the right landed"
    );
    Ok(())
}

/// RdmaAccess MissingRemoteRead.
pub fn mr_missing_remote_read<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, PAGE, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let link = env.link(&pd, QP_RW)?;
    expect(
        env.engine_read(&link, mr_at(&mr, 0), 64)?,
        WcStatus::RemAccessErr,
        "READ without REMOTE_READ",
    )
}

/// Bounds of a plain MR: a WRITE crossing its end fails.
pub fn mr_access_out_of_bounds<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, PAGE, MR_RW)?;
    let link = env.link(&pd, QP_RW)?;
    expect(
        env.engine_write(&link, mr_at(&mr, P - 8), 16)?,
        WcStatus::RemAccessErr,
        "WRITE across the end",
    )?;
    ensure!(all(&bytes(&mr, PAGE - 8, 8)?, 0), "partial WRITE landed");
    Ok(())
}

/// The rkey of a deregistered MR finds nothing.
pub fn stale_mr_key_after_dereg<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, PAGE, MR_RW)?;
    let stale = mr_at(&mr, 0);
    env.dev
        .dereg_mr(mr)
        .map_err(|e| Failure(format!("dereg: {e}")))?;
    let link = env.link(&pd, QP_RW)?;
    expect(
        env.engine_write(&link, stale, 64)?,
        WcStatus::RemAccessErr,
        "WRITE with a deregistered key",
    )
}

/// Responder check 1: a QP without remote write refuses WRITEs as invalid requests (not access
/// errors), even into an MR that allows them.
pub fn qp_without_remote_write<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, PAGE, MR_RW)?;
    let link = env.link(&pd, Access::REMOTE_READ)?;
    expect(
        env.engine_write(&link, mr_at(&mr, 0), 64)?,
        WcStatus::RemInvReqErr,
        "WRITE to a read-only QP",
    )?;
    ensure!(
        all(&bytes(&mr, 0, 64)?, 0),
        "WRITE to a read-only QP landed"
    );
    env.wait_state(&link.qp, QpState::Error)
}

/// A READ landing in memory without LOCAL_WRITE fails locally (LOC_PROT_ERR).
pub fn local_read_target_without_local_write<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, PAGE, Access::NONE)?;
    let link = env.link(&pd, QP_RW)?;
    let op = SendOp::RdmaRead {
        sge: Sge {
            mr: &mr,
            offset: 0,
            len: 64,
        },
        remote: RemoteAddr {
            addr: env.engine.mr.addr,
            rkey: env.engine.mr.rkey,
        },
    };
    expect(
        env.local_op(&link, op)?,
        WcStatus::LocProtErr,
        "READ into memory without LOCAL_WRITE",
    )?;
    env.wait_state(&link.qp, QpState::Error)
}

/// An SGE naming an MR of another PD fails locally (LOC_PROT_ERR).
pub fn local_sge_of_other_pd<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let other = env.dev.alloc_pd()?;
    let mr = env.mr(&other, PAGE, MR_RW)?;
    let link = env.link(&pd, QP_RW)?;
    let op = SendOp::RdmaWrite {
        sge: Sge {
            mr: &mr,
            offset: 0,
            len: 64,
        },
        remote: RemoteAddr {
            addr: env.engine.mr.addr,
            rkey: env.engine.mr.rkey,
        },
    };
    expect(
        env.local_op(&link, op)?,
        WcStatus::LocProtErr,
        "WRITE from another PD's MR",
    )
}

/// A SEND into a receive buffer without LOCAL_WRITE: REM_OP_ERR at the requester, LOC_PROT_ERR
/// at the responder.
pub fn send_into_recv_without_local_write<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, PAGE, Access::NONE)?;
    let link = env.link(&pd, QP_RW)?;
    link.qp.post_recv(RecvWr {
        wr_id: 5,
        sge: Some(Sge {
            mr: &mr,
            offset: 0,
            len: 64,
        }),
    })?;
    expect(
        env.engine_send(&link, 16, None)?,
        WcStatus::RemOpErr,
        "SEND",
    )?;
    expect(
        env.wait(&link.recv_cq)?.status,
        WcStatus::LocProtErr,
        "responder's receive",
    )
}

/// A SEND larger than the receive buffer: REM_INV_REQ_ERR there, LOC_LEN_ERR here.
pub fn recv_too_small<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, PAGE, MR_RW)?;
    let link = env.link(&pd, QP_RW)?;
    link.qp.post_recv(RecvWr {
        wr_id: 6,
        sge: Some(Sge {
            mr: &mr,
            offset: 0,
            len: 16,
        }),
    })?;
    expect(
        env.engine_send(&link, 64, None)?,
        WcStatus::RemInvReqErr,
        "SEND",
    )?;
    expect(
        env.wait(&link.recv_cq)?.status,
        WcStatus::LocLenErr,
        "responder's receive",
    )
}

/// Class-C failure semantics: the bad request completes with REM_ACCESS_ERR, the requests
/// posted behind it are flushed and never land, later posts are flushed, the responder QP goes to
/// ERROR and reports an access error event, and the counters record it.
pub fn error_flushes_later_wrs<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd = env.dev.alloc_pd()?;
    let mr = env.mr(&pd, PAGE, MR_RW)?;
    let link = env.link(&pd, QP_RW)?;
    let write = |rkey, id| {
        env.peer.post(
            link.peer_qp,
            id,
            PeerWr::Write {
                mr: env.engine.mr.id,
                offset: 0,
                len: 64,
                remote: RemoteAddr {
                    addr: mr.addr(),
                    rkey,
                },
            },
        )
    };
    write(other_key_byte(mr.rkey()), 1)?;
    write(mr.rkey(), 2)?;
    write(mr.rkey(), 3)?;
    expect(
        env.peer_status(link.peer_qp)?,
        WcStatus::RemAccessErr,
        "bad WRITE",
    )?;
    expect(
        env.peer_status(link.peer_qp)?,
        WcStatus::WrFlushErr,
        "WRITE behind it",
    )?;
    expect(
        env.peer_status(link.peer_qp)?,
        WcStatus::WrFlushErr,
        "second WRITE behind it",
    )?;
    write(mr.rkey(), 4)?;
    expect(
        env.peer_status(link.peer_qp)?,
        WcStatus::WrFlushErr,
        "WRITE posted in ERROR",
    )?;
    ensure!(all(&bytes(&mr, 0, 64)?, 0), "a flushed WRITE landed");
    env.wait_state(&link.qp, QpState::Error)?;
    let want = AsyncEvent::QpAccessErr {
        qp_num: link.qp.qp_num(),
    };
    let deadline = std::time::Instant::now() + env.timeout;
    while env.dev.poll_async_event() != Some(want) {
        ensure!(std::time::Instant::now() < deadline, "no {want:?} event");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let c = link.qp.counters();
    ensure!(c.remote_access_errors == 1, "QP counters {c:?}");
    Ok(())
}

/// Attack: a peer serving tenant B tries tenant A's keys (the exact one, and its sequential
/// neighbours) through B's connection. Each try fails and kills only B's connection; A's
/// connection and data are untouched.
pub fn guessed_rkeys_fail_and_spare_other_tenants<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd_a = env.dev.alloc_pd()?;
    let pd_b = env.dev.alloc_pd()?;
    let mr_a = env.mr(&pd_a, PAGE, MR_RW)?;
    let link_a = env.link(&pd_a, QP_RW)?;
    let known = mr_a.rkey();
    for guess in [
        known,
        known.wrapping_add(0x101),
        known.wrapping_sub(0x101),
        inc_rkey(known),
    ] {
        let link_b = env.link(&pd_b, QP_RW)?;
        let target = RemoteAddr {
            addr: mr_a.addr(),
            rkey: guess,
        };
        let status = env.engine_write(&link_b, target, 64)?;
        expect(status, WcStatus::RemAccessErr, &format!("guess {guess:#x}"))?;
        env.wait_state(&link_b.qp, QpState::Error)?;
    }
    ensure!(
        all(&bytes(&mr_a, 0, PAGE)?, 0),
        "a guess landed in tenant A's memory"
    );
    ensure!(
        link_a.qp.state() == QpState::Rts,
        "tenant A's QP was disturbed"
    );
    expect(
        env.engine_write(&link_a, mr_at(&mr_a, 0), 64)?,
        WcStatus::Success,
        "tenant A's own WRITE",
    )
}

/// Confused deputy across processes: tenant B is another process on the same node (the same
/// device, hence the same key space); the engine uses tenant A's rkey on B's connection. B's
/// responder finds A's MR in the shared table and refuses it on the PD check.
pub fn cross_tenant_rkey_across_processes<D: RdmaDevice>(env: &Env<D>) -> CaseResult {
    let pd_a = env.dev.alloc_pd()?;
    let mr_a = env.mr(&pd_a, PAGE, MR_RW)?;
    let link_a = env.link(&pd_a, QP_RW)?;
    let peer = &env.peer;
    let dev_b = peer.open(&env.node)?;
    let pd_b = peer.alloc_pd(dev_b)?;
    let qp_b = peer.create_qp(dev_b, pd_b, Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    let engine_b = peer.create_qp(
        env.engine.dev,
        env.engine.pd,
        Access::REMOTE_WRITE | Access::REMOTE_READ,
    )?;
    peer.rtr(qp_b.id, &engine_b.endpoint)?;
    peer.rtr(engine_b.id, &qp_b.endpoint)?;
    peer.rts(qp_b.id)?;
    peer.rts(engine_b.id)?;
    let outcome = (|| {
        peer.post(
            engine_b.id,
            1,
            PeerWr::Write {
                mr: env.engine.mr.id,
                offset: 0,
                len: 64,
                remote: mr_at(&mr_a, 0),
            },
        )?;
        expect(
            env.peer_status(engine_b.id)?,
            WcStatus::RemAccessErr,
            "tenant A's rkey on B's QP",
        )?;
        ensure!(
            all(&bytes(&mr_a, 0, 64)?, 0),
            "tenant B's connection wrote into tenant A"
        );
        env.wait_peer_state(qp_b.id, QpState::Error)?;
        expect(
            env.engine_write(&link_a, mr_at(&mr_a, 0), 64)?,
            WcStatus::Success,
            "tenant A's own WRITE",
        )
    })();
    for id in [engine_b.id, qp_b.id, pd_b, dev_b] {
        peer.drop_object(id)?;
    }
    outcome
}
