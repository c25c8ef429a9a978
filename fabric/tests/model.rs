// Over 600 lines: one model-based property test: the model, the operations and the checker belong together.
//! Property test: random sequences of registrations, window binds, invalidations,
//! deregistrations, reconnects and remote accesses (with random keys, ranges, rights and QPs)
//! run against the software provider and against a small reference model of the verbs rules
//! (docs/fabric.md, "Type-2 memory windows" and "The responder's checks"); every outcome must
//! match.
//!
//! In-process: node 1 (the memory owner) and node 2 (the requesters) are two devices opened by
//! this process, connected over loopback TCP.

use std::time::{Duration, Instant};

use dpufs_fabric::soft::{DeviceOptions, SoftCq, SoftDevice, SoftMr, SoftMw, SoftPd, SoftQp};
use dpufs_fabric::{
    Access, CompletionQueue, FabricError, KeyGen, MemoryRegion, MemoryWindow, MwBind, NicChecks,
    QpCaps, QpState, QpTransition, QueuePair, RdmaDevice, RemoteAddr, SendOp, SendWr, Sge,
    WcStatus, inc_rkey, key_index,
};
use proptest::prelude::*;

const PAGE: u64 = 4096;
const SLOTS: usize = 3;
const QPS: usize = 3;
const WAIT: Duration = Duration::from_secs(10);

/// MR sizes end mid-page, so only the bounds check (not the page-granular mapping) stops an
/// access just past an MR's end.
fn mr_len(pages: u64) -> u64 {
    pages * PAGE - 1000
}

/// Which key a remote access uses.
#[derive(Clone, Copy, Debug)]
enum KeyChoice {
    /// The MR in a slot (its last key if it was deregistered).
    Mr(usize),
    /// The window in a slot, current key.
    Mw(usize),
    /// The window in a slot, the key before its last bind.
    MwStale(usize),
    /// Anything.
    Guess(u32),
}

/// Which QP an operation goes through.
#[derive(Clone, Copy, Debug)]
enum QpChoice {
    /// The one that makes sense for the object: the window's binding QP, or a QP of the
    /// object's PD (so the interesting rules get exercised, not just the PD check).
    Fitting,
    /// Any QP.
    Any(usize),
}

#[derive(Clone, Debug)]
enum Op {
    RegMr {
        slot: usize,
        pd: usize,
        access: Access,
        pages: u64,
    },
    DeregMr {
        slot: usize,
    },
    AllocMw {
        slot: usize,
        pd: usize,
    },
    DeallocMw {
        slot: usize,
    },
    Bind {
        mw: usize,
        mr: usize,
        qp: QpChoice,
        offset: u64,
        len: u64,
        rights: Access,
    },
    LocalInv {
        mw: usize,
        qp: QpChoice,
    },
    Access {
        qp: QpChoice,
        key: KeyChoice,
        write: bool,
        offset: u64,
        len: usize,
    },
    /// Replace every QP pair in ERROR by a new one.
    Reconnect,
}

/// Mostly the useful combinations, sometimes anything (including the invalid ones).
fn access_flags() -> impl Strategy<Value = Access> {
    let useful = prop::sample::select(vec![
        Access::LOCAL_WRITE | Access::MW_BIND,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::MW_BIND,
        Access::REMOTE_READ | Access::MW_BIND,
    ]);
    prop_oneof![2 => useful, 1 => any_flags()]
}

fn any_flags() -> impl Strategy<Value = Access> {
    prop::collection::vec(
        prop::sample::select(vec![
            Access::LOCAL_WRITE,
            Access::REMOTE_WRITE,
            Access::REMOTE_READ,
            Access::MW_BIND,
        ]),
        0..4,
    )
    .prop_map(|flags| flags.into_iter().fold(Access::NONE, |a, f| a | f))
}

fn rights() -> impl Strategy<Value = Access> {
    prop::sample::select(vec![
        Access::REMOTE_READ,
        Access::REMOTE_WRITE,
        Access::REMOTE_READ | Access::REMOTE_WRITE,
    ])
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..SLOTS;
    let qp = prop_oneof![2 => Just(QpChoice::Fitting), 1 => (0..QPS).prop_map(QpChoice::Any)];
    let key = prop_oneof![
        3 => (0..SLOTS).prop_map(KeyChoice::Mr),
        4 => (0..SLOTS).prop_map(KeyChoice::Mw),
        2 => (0..SLOTS).prop_map(KeyChoice::MwStale),
        1 => any::<u32>().prop_map(KeyChoice::Guess),
    ];
    // Mostly inside a small object, sometimes well past it.
    // Mostly inside a small object, sometimes just short of a page end (where MRs end, see
    // `mr_len`), sometimes anywhere.
    let offset = prop_oneof![
        3 => 0..PAGE / 2,
        1 => (1..4u64, 0..1100u64).prop_map(|(pages, back)| pages * PAGE - back),
        1 => 0..5 * PAGE,
    ];
    let len = prop_oneof![3 => 1..256usize, 1 => 1..2048usize];
    prop_oneof![
        2 => (slot.clone(), 0..2usize, access_flags(), 1..4u64)
            .prop_map(|(slot, pd, access, pages)| Op::RegMr { slot, pd, access, pages }),
        1 => slot.clone().prop_map(|slot| Op::DeregMr { slot }),
        1 => (slot.clone(), 0..2usize).prop_map(|(slot, pd)| Op::AllocMw { slot, pd }),
        1 => slot.clone().prop_map(|slot| Op::DeallocMw { slot }),
        6 => (slot.clone(), slot.clone(), qp.clone(), 0..4u64, prop_oneof![1 => Just(0u64), 6 => 1..3u64], rights())
            .prop_map(|(mw, mr, qp, offset, len, rights)| Op::Bind {
                mw, mr, qp, offset: offset * PAGE / 2, len: len * PAGE / 2, rights,
            }),
        4 => (slot.clone(), qp.clone()).prop_map(|(mw, qp)| Op::LocalInv { mw, qp }),
        10 => (qp.clone(), key, any::<bool>(), offset, len)
            .prop_map(|(qp, key, write, offset, len)| Op::Access { qp, key, write, offset, len }),
        8 => Just(Op::Reconnect),
    ]
}

// ---------------------------------------------------------------------------------------------
// The reference model: the rules, restated plainly.

#[derive(Clone, Debug)]
struct ModelMr {
    pd: usize,
    access: Access,
    key: u32,
    addr: u64,
    len: u64,
    bound: u32,
}

#[derive(Clone, Debug)]
struct ModelMw {
    pd: usize,
    key: u32,
    stale_key: Option<u32>,
    valid: bool,
    /// Binding fields of the last bind: QP number, MR slot, range, rights.
    qp: Option<u32>,
    mr: usize,
    addr: u64,
    len: u64,
    rights: Access,
}

#[derive(Default, Debug)]
struct Model {
    mrs: [Option<ModelMr>; SLOTS],
    /// Key, address and PD of the last MR registered in each slot.
    last_mr_key: [Option<(u32, u64, usize)>; SLOTS],
    mws: [Option<ModelMw>; SLOTS],
    qp_pd: [usize; QPS],
    qp_access: [Access; QPS],
    qp_num: [u32; QPS],
    qp_alive: [bool; QPS],
}

impl Model {
    /// The QP index for `choice`: the one bound as `bound`, else the first live QP of `pd`.
    fn pick(&self, choice: QpChoice, bound: Option<u32>, pd: usize) -> usize {
        match choice {
            QpChoice::Any(qp) => qp,
            QpChoice::Fitting => bound
                .and_then(|num| self.qp_num.iter().position(|&n| n == num))
                .or_else(|| (0..QPS).find(|&q| self.qp_pd[q] == pd && self.qp_alive[q]))
                .unwrap_or(QP_PD.iter().position(|&p| p == pd).unwrap_or(0)),
        }
    }

    fn bind(
        &self,
        mw: &ModelMw,
        mr: &ModelMr,
        qp: usize,
        offset: u64,
        len: u64,
        rights: Access,
    ) -> WcStatus {
        let rules_hold = self.qp_pd[qp] == mw.pd
            && len != 0
            && mr.pd == mw.pd
            && mr.access.contains(Access::MW_BIND)
            && (!rights.contains(Access::REMOTE_WRITE) || mr.access.contains(Access::LOCAL_WRITE))
            && offset + len <= mr.len
            && !mw.valid;
        if rules_hold {
            WcStatus::Success
        } else {
            WcStatus::MwBindErr
        }
    }

    fn local_inv(&self, mw: &ModelMw, qp: usize) -> WcStatus {
        if mw.valid && mw.qp == Some(self.qp_num[qp]) && mw.pd == self.qp_pd[qp] {
            WcStatus::Success
        } else {
            WcStatus::MwBindErr
        }
    }

    /// The responder's checks for a request of `len` at `addr` with `key` arriving on QP `qp`.
    fn access(&self, qp: usize, key: u32, addr: u64, len: u64, write: bool) -> WcStatus {
        let right = if write {
            Access::REMOTE_WRITE
        } else {
            Access::REMOTE_READ
        };
        if !self.qp_access[qp].contains(right) {
            return WcStatus::RemInvReqErr;
        }
        let inside = |base: u64, size: u64| addr >= base && addr + len <= base + size;
        let ok = |cond: bool| {
            if cond {
                WcStatus::Success
            } else {
                WcStatus::RemAccessErr
            }
        };
        let index = key_index(key);
        if let Some(mr) = self
            .mrs
            .iter()
            .flatten()
            .find(|m| key_index(m.key) == index)
        {
            return ok(mr.key == key
                && mr.pd == self.qp_pd[qp]
                && mr.access.contains(right)
                && inside(mr.addr, mr.len));
        }
        if let Some(mw) = self
            .mws
            .iter()
            .flatten()
            .find(|w| key_index(w.key) == index)
        {
            return ok(mw.key == key
                && mw.pd == self.qp_pd[qp]
                && mw.qp == Some(self.qp_num[qp])
                && mw.rights.contains(right)
                && mw.valid
                && inside(mw.addr, mw.len));
        }
        WcStatus::RemAccessErr
    }
}

// ---------------------------------------------------------------------------------------------
// The system under test.

struct Pair {
    local: SoftQp,
    local_cq: SoftCq,
    remote: SoftQp,
    remote_cq: SoftCq,
}

struct Sut {
    node1: SoftDevice,
    node2: SoftDevice,
    pds: [SoftPd; 2],
    remote_pd: SoftPd,
    source: SoftMr,
    landing: SoftMr,
    pairs: Vec<Pair>,
    mrs: [Option<SoftMr>; SLOTS],
    mws: [Option<SoftMw>; SLOTS],
    _dir: tempfile::TempDir,
}

const QP_ACCESS: [Access; QPS] = [
    Access::from_bits_truncate(Access::REMOTE_READ.bits() | Access::REMOTE_WRITE.bits()),
    Access::from_bits_truncate(Access::REMOTE_READ.bits() | Access::REMOTE_WRITE.bits()),
    Access::REMOTE_READ,
];
const QP_PD: [usize; QPS] = [0, 0, 1];

fn wait_state(qp: &SoftQp, state: QpState) -> Result<(), TestCaseError> {
    let deadline = Instant::now() + WAIT;
    while qp.state() != state {
        prop_assert!(Instant::now() < deadline, "QP stuck in {:?}", qp.state());
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

impl Sut {
    fn new(disabled: NicChecks) -> Result<Sut, FabricError> {
        let dir = tempfile::Builder::new()
            .prefix("dpufs-fabric-model")
            .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
                "/dev/shm"
            } else {
                "/tmp"
            })
            .map_err(|e| FabricError::InvalidArgument(e.to_string()))?;
        let opts = |name: &str| DeviceOptions {
            table_entries: 256,
            key_gen: KeyGen::Random,
            disabled_checks: disabled,
            ..DeviceOptions::new(name).in_dir(dir.path())
        };
        let node1 = SoftDevice::open(&opts("node1"))?;
        let node2 = SoftDevice::open(&opts("node2"))?;
        let pds = [node1.alloc_pd()?, node1.alloc_pd()?];
        let remote_pd = node2.alloc_pd()?;
        let remote_rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let source = node2.reg_mr(&remote_pd, 8192, remote_rw)?;
        let landing = node2.reg_mr(&remote_pd, 8192, remote_rw)?;
        let mut sut = Sut {
            node1,
            node2,
            pds,
            remote_pd,
            source,
            landing,
            pairs: Vec::new(),
            mrs: Default::default(),
            mws: Default::default(),
            _dir: dir,
        };
        for qp in 0..QPS {
            let pair = sut.connect(qp)?;
            sut.pairs.push(pair);
        }
        Ok(sut)
    }

    fn connect(&self, qp: usize) -> Result<Pair, FabricError> {
        let local_cq = self.node1.create_cq(16)?;
        let remote_cq = self.node2.create_cq(16)?;
        let local = self.node1.create_qp(
            &self.pds[QP_PD[qp]],
            &local_cq,
            &local_cq,
            QpCaps::default(),
        )?;
        let remote =
            self.node2
                .create_qp(&self.remote_pd, &remote_cq, &remote_cq, QpCaps::default())?;
        local.modify(QpTransition::Init {
            access: QP_ACCESS[qp],
        })?;
        remote.modify(QpTransition::Init {
            access: Access::NONE,
        })?;
        local.modify(QpTransition::Rtr {
            remote: remote.endpoint(),
        })?;
        remote.modify(QpTransition::Rtr {
            remote: local.endpoint(),
        })?;
        local.modify(QpTransition::Rts)?;
        remote.modify(QpTransition::Rts)?;
        Ok(Pair {
            local,
            local_cq,
            remote,
            remote_cq,
        })
    }

    fn local_op(
        &self,
        qp: usize,
        op: SendOp<'_, SoftMr, SoftMw>,
    ) -> Result<WcStatus, TestCaseError> {
        let pair = &self.pairs[qp];
        pair.local
            .post_send(SendWr {
                wr_id: 1,
                op,
                signaled: true,
            })
            .map_err(fail)?;
        let wc = pair
            .local_cq
            .wait(WAIT)
            .ok_or_else(|| fail("no local completion"))?;
        Ok(wc.status)
    }

    fn remote_access(
        &self,
        qp: usize,
        remote: RemoteAddr,
        len: usize,
        write: bool,
        fill: u8,
    ) -> Result<WcStatus, TestCaseError> {
        let pair = &self.pairs[qp];
        let op = if write {
            // SAFETY: one thread; nothing is posted on the source yet.
            unsafe { self.source.write_at(0, &vec![fill; len]) }.map_err(fail)?;
            SendOp::RdmaWrite {
                sge: Sge {
                    mr: &self.source,
                    offset: 0,
                    len,
                },
                remote,
            }
        } else {
            SendOp::RdmaRead {
                sge: Sge {
                    mr: &self.landing,
                    offset: 0,
                    len,
                },
                remote,
            }
        };
        pair.remote
            .post_send(SendWr {
                wr_id: 2,
                op,
                signaled: true,
            })
            .map_err(fail)?;
        let wc = pair
            .remote_cq
            .wait(WAIT)
            .ok_or_else(|| fail("no remote completion"))?;
        Ok(wc.status)
    }

    /// After a failure on pair `qp`, both ends end up in ERROR; wait for it so the next
    /// operation sees a settled state.
    fn settle_dead(&self, qp: usize) -> Result<(), TestCaseError> {
        wait_state(&self.pairs[qp].local, QpState::Error)?;
        wait_state(&self.pairs[qp].remote, QpState::Error)
    }
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

fn run(disabled: NicChecks, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut sut = Sut::new(disabled).map_err(fail)?;
    let mut model = Model {
        qp_pd: QP_PD,
        qp_access: QP_ACCESS,
        qp_num: std::array::from_fn(|i| sut.pairs[i].local.qp_num()),
        qp_alive: [true; QPS],
        ..Model::default()
    };
    // Start from a useful state: MRs that take windows, in both PDs, and unbound windows.
    let full = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::MW_BIND;
    let setup = [
        Op::RegMr {
            slot: 0,
            pd: 0,
            access: full,
            pages: 2,
        },
        Op::RegMr {
            slot: 1,
            pd: 0,
            access: Access::LOCAL_WRITE | Access::MW_BIND,
            pages: 2,
        },
        Op::RegMr {
            slot: 2,
            pd: 1,
            access: full,
            pages: 1,
        },
        Op::AllocMw { slot: 0, pd: 0 },
        Op::AllocMw { slot: 1, pd: 0 },
        Op::AllocMw { slot: 2, pd: 1 },
    ];
    for (step, op) in setup.iter().chain(ops).enumerate() {
        let fill = (step % 250) as u8 + 1;
        match *op {
            Op::RegMr {
                slot,
                pd,
                access,
                pages,
            } => {
                if sut.mrs[slot].is_some() {
                    continue;
                }
                let valid =
                    !access.contains(Access::REMOTE_WRITE) || access.contains(Access::LOCAL_WRITE);
                let got = sut
                    .node1
                    .reg_mr(&sut.pds[pd], mr_len(pages) as usize, access);
                prop_assert_eq!(got.is_ok(), valid, "reg_mr {:?}", access);
                if let Ok(mr) = got {
                    model.mrs[slot] = Some(ModelMr {
                        pd,
                        access,
                        key: mr.rkey(),
                        addr: mr.addr(),
                        len: mr_len(pages),
                        bound: 0,
                    });
                    model.last_mr_key[slot] = Some((mr.rkey(), mr.addr(), pd));
                    sut.mrs[slot] = Some(mr);
                }
            }
            Op::DeregMr { slot } => {
                let Some(mr) = sut.mrs[slot].take() else {
                    continue;
                };
                let busy = model.mrs[slot].as_ref().is_some_and(|m| m.bound > 0);
                match sut.node1.dereg_mr(mr) {
                    Ok(()) => {
                        prop_assert!(!busy, "dereg of an MR with bound windows succeeded");
                        model.mrs[slot] = None;
                    }
                    Err(e) => {
                        prop_assert!(
                            busy && matches!(e.error, FabricError::Busy(_)),
                            "dereg: {}",
                            e.error
                        );
                        sut.mrs[slot] = Some(e.mr);
                    }
                }
            }
            Op::AllocMw { slot, pd } => {
                if sut.mws[slot].is_some() {
                    continue;
                }
                let mw = sut.node1.alloc_mw(&sut.pds[pd]).map_err(fail)?;
                model.mws[slot] = Some(ModelMw {
                    pd,
                    key: mw.rkey(),
                    stale_key: None,
                    valid: false,
                    qp: None,
                    mr: 0,
                    addr: 0,
                    len: 0,
                    rights: Access::NONE,
                });
                sut.mws[slot] = Some(mw);
            }
            Op::DeallocMw { slot } => {
                let Some(mw) = sut.mws[slot].take() else {
                    continue;
                };
                sut.node1.dealloc_mw(mw).map_err(fail)?;
                if let Some(w) = model.mws[slot].take().filter(|w| w.valid)
                    && let Some(mr) = model.mrs[w.mr].as_mut()
                {
                    mr.bound -= 1;
                }
            }
            Op::Bind {
                mw,
                mr,
                qp,
                offset,
                len,
                rights,
            } => {
                let (Some(sw), Some(smr)) = (&sut.mws[mw], &sut.mrs[mr]) else {
                    continue;
                };
                let (Some(mw_m), Some(mr_m)) = (model.mws[mw].as_ref(), model.mrs[mr].as_ref())
                else {
                    continue;
                };
                let qp = model.pick(qp, None, mw_m.pd);
                let want = if model.qp_alive[qp] {
                    model.bind(mw_m, mr_m, qp, offset, len, rights)
                } else {
                    WcStatus::WrFlushErr
                };
                let rkey = inc_rkey(sw.rkey());
                let bind = MwBind {
                    mw: sw,
                    mr: smr,
                    rkey,
                    addr: smr.addr() + offset,
                    len,
                    access: rights,
                };
                let got = sut.local_op(qp, SendOp::BindMw(bind))?;
                prop_assert_eq!(got, want, "step {}: {:?}", step, op);
                match got {
                    WcStatus::Success => {
                        let addr = mr_m.addr + offset;
                        let qp_num = model.qp_num[qp];
                        let w = model.mws[mw].as_mut().expect("checked above");
                        w.stale_key = Some(w.key);
                        w.key = rkey;
                        w.valid = true;
                        w.qp = Some(qp_num);
                        w.mr = mr;
                        w.addr = addr;
                        w.len = len;
                        w.rights = rights;
                        model.mrs[mr].as_mut().expect("checked above").bound += 1;
                    }
                    WcStatus::MwBindErr => {
                        model.qp_alive[qp] = false;
                        sut.settle_dead(qp)?;
                    }
                    _ => {}
                }
            }
            Op::LocalInv { mw, qp } => {
                let Some(w) = model.mws[mw].as_ref() else {
                    continue;
                };
                let qp = model.pick(qp, w.qp, w.pd);
                let want = if model.qp_alive[qp] {
                    model.local_inv(w, qp)
                } else {
                    WcStatus::WrFlushErr
                };
                let got = sut.local_op(qp, SendOp::LocalInv { rkey: w.key })?;
                prop_assert_eq!(got, want, "step {}: {:?}", step, op);
                match got {
                    WcStatus::Success => {
                        let w = model.mws[mw].as_mut().expect("checked above");
                        w.valid = false;
                        let mr = w.mr;
                        model.mrs[mr]
                            .as_mut()
                            .expect("bound MR is registered")
                            .bound -= 1;
                    }
                    WcStatus::MwBindErr => {
                        model.qp_alive[qp] = false;
                        sut.settle_dead(qp)?;
                    }
                    _ => {}
                }
            }
            Op::Access {
                qp,
                key,
                write,
                offset,
                len,
            } => {
                let target = match key {
                    KeyChoice::Mr(slot) => {
                        model.last_mr_key[slot].map(|(k, a, pd)| (k, a, None, pd))
                    }
                    KeyChoice::Mw(slot) => model.mws[slot]
                        .as_ref()
                        .filter(|w| w.qp.is_some())
                        .map(|w| (w.key, w.addr, w.qp, w.pd)),
                    KeyChoice::MwStale(slot) => model.mws[slot]
                        .as_ref()
                        .and_then(|w| Some((w.stale_key?, w.addr, w.qp, w.pd))),
                    KeyChoice::Guess(k) => Some((k, 0, None, 0)),
                };
                let Some((rkey, base, bound, pd)) = target else {
                    continue;
                };
                let qp = model.pick(qp, bound, pd);
                let addr = base + offset;
                let want = if model.qp_alive[qp] {
                    model.access(qp, rkey, addr, len as u64, write)
                } else {
                    WcStatus::WrFlushErr
                };
                let got = sut.remote_access(qp, RemoteAddr { addr, rkey }, len, write, fill)?;
                prop_assert_eq!(got, want, "step {}: {:?} (rkey {:#x})", step, op, rkey);
                match got {
                    WcStatus::Success if write => {
                        // The data landed where the model says: find the MR behind the key.
                        let (slot, mr_offset) = landing(&model, rkey, addr);
                        let mut back = vec![0u8; len];
                        let mr = sut.mrs[slot].as_ref().expect("live MR");
                        // SAFETY: one thread; the WRITE has completed.
                        unsafe { mr.read_at(mr_offset as usize, &mut back) }.map_err(fail)?;
                        prop_assert!(back.iter().all(|&b| b == fill), "WRITE data not in place");
                    }
                    WcStatus::RemAccessErr | WcStatus::RemInvReqErr => {
                        model.qp_alive[qp] = false;
                        sut.settle_dead(qp)?;
                    }
                    _ => {}
                }
            }
            Op::Reconnect => {
                let dead: Vec<usize> = (0..QPS).filter(|&qp| !model.qp_alive[qp]).collect();
                for qp in dead {
                    let pair = sut.connect(qp).map_err(fail)?;
                    model.qp_num[qp] = pair.local.qp_num();
                    model.qp_alive[qp] = true;
                    sut.pairs[qp] = pair;
                }
            }
        }
    }
    Ok(())
}

/// Slot and offset of the MR memory a successful access with `rkey` at `addr` touched.
fn landing(model: &Model, rkey: u32, addr: u64) -> (usize, u64) {
    for (slot, mr) in model.mrs.iter().enumerate() {
        if let Some(mr) = mr
            && mr.key == rkey
        {
            return (slot, addr - mr.addr);
        }
    }
    let w = model
        .mws
        .iter()
        .flatten()
        .find(|w| w.key == rkey)
        .expect("key of a live object");
    let mr = model.mrs[w.mr].as_ref().expect("bound MR is registered");
    (w.mr, addr - mr.addr)
}

fn config(cases: u32, max_shrink_iters: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        max_shrink_iters,
        // Failures are printed, shrunk; no regression files in the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A window's life as the I/O path uses it: bind, access, invalidate, then either a late access
/// with the same key, or a rebind and a replay of the old key.
fn window_life() -> impl Strategy<Value = Vec<Op>> {
    // The first access sometimes crosses the window's end.
    let first = prop::sample::select(vec![16, PAGE / 2 - 32]);
    (
        0..SLOTS,
        0..SLOTS,
        rights(),
        any::<bool>(),
        any::<bool>(),
        first,
    )
        .prop_map(|(mw, mr, rights, write, replay, first)| {
            let bind = Op::Bind {
                mw,
                mr,
                qp: QpChoice::Fitting,
                offset: 0,
                len: PAGE / 2,
                rights,
            };
            let access = |key, offset| Op::Access {
                qp: QpChoice::Fitting,
                key,
                write,
                offset,
                len: 64,
            };
            let mut ops = vec![
                bind.clone(),
                access(KeyChoice::Mw(mw), first),
                Op::LocalInv {
                    mw,
                    qp: QpChoice::Fitting,
                },
            ];
            if replay {
                ops.extend([bind, access(KeyChoice::MwStale(mw), 16)]);
            } else {
                ops.push(access(KeyChoice::Mw(mw), 16));
            }
            ops
        })
}

fn sequences() -> impl Strategy<Value = Vec<Op>> {
    let chunk = prop_oneof![6 => op().prop_map(|op| vec![op]), 1 => window_life()];
    prop::collection::vec(chunk, 1..40).prop_map(|chunks| chunks.concat())
}

proptest! {
    #![proptest_config(config(96, 200))]

    #[test]
    fn provider_matches_model(ops in sequences()) {
        run(NicChecks::NONE, &ops)?;
    }
}

/// The model is sharp enough to notice any single NIC check missing from the provider.
#[test]
fn model_notices_each_disabled_check() {
    for (check, name) in NicChecks::each() {
        // Stops at the first divergence; the bound only matters if the model is blind.
        let mut runner = proptest::test_runner::TestRunner::new(config(256, 0));
        let outcome = runner.run(&sequences(), |ops| run(check, &ops));
        assert!(
            outcome.is_err(),
            "the model did not notice `{name}` switched off"
        );
    }
}
