//! A peer behind a slow link must not slow the other QPs of a completion queue. A caller
//! waiting on a CQ drives every QP of it (it reads their responses and serves their peers'
//! requests in its own thread); if it waited there for a payload trickling in from a slow peer,
//! every other QP's completions would wait too, as an engine's requests from every node waited
//! behind one node with a delayed link (docs/reliability.md, "Chaos across nodes").

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dpufs_fabric::conformance::{Env, Peer, PeerMr, PeerWr};
use dpufs_fabric::soft::{DeviceOptions, SoftCq, SoftDevice, SoftMr, SoftPd, SoftQp};
use dpufs_fabric::{
    Access, CompletionQueue, Endpoint, MemoryRegion, QpCaps, QpTransition, QueuePair, RdmaDevice,
    RemoteAddr, SendOp, SendWr, Sge, WcStatus,
};

const MIB: usize = 1 << 20;
/// The slow link's pace: a piece every [`PACE`], each way (1 MiB takes about 1.3 s).
const PIECE: usize = 16 << 10;
const PACE: Duration = Duration::from_millis(20);
/// What the peer's buffer holds.
const FILL: u8 = 0x5a;

/// Copies `from` to `to` a piece per pace until either side closes.
fn paced(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; PIECE];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        std::thread::sleep(PACE);
    }
}

/// A slow TCP relay to `target` for one connection.
fn slow_relay(target: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (near, _) = listener.accept().unwrap();
        let far = TcpStream::connect(target).unwrap();
        for s in [&near, &far] {
            s.set_nodelay(true).unwrap();
        }
        let (near2, far2) = (near.try_clone().unwrap(), far.try_clone().unwrap());
        std::thread::spawn(move || paced(near2, far2));
        paced(far, near);
    });
    addr
}

/// `endpoint` (a soft device's reads `tcp:<addr>/qp=…`), reached through a [`slow_relay`].
fn through_slow_relay(endpoint: &Endpoint) -> Endpoint {
    let text = String::from_utf8(endpoint.0.clone()).unwrap();
    let rest = text.strip_prefix("tcp:").expect("a soft endpoint");
    let (target, tail) = rest.split_once('/').expect("fields after the address");
    let relay = slow_relay(target.parse().unwrap());
    Endpoint(format!("tcp:{relay}/{tail}").into_bytes())
}

/// This process's QPs on one CQ, connected to an engine in a peer process on another device.
struct Bed {
    _dir: tempfile::TempDir,
    env: Env<SoftDevice>,
    /// 1 MiB of the peer's, filled with [`FILL`].
    remote: PeerMr,
    pd: SoftPd,
    /// 1 MiB of ours, zeroed.
    local: SoftMr,
    cq: SoftCq,
}

impl Bed {
    fn new() -> Bed {
        let dir = common::device_dir("dpufs-fabric-slow");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric-peer"));
        cmd.arg(dir.path());
        let peer = Peer::spawn(cmd).expect("spawn peer");
        let dev = SoftDevice::open(&DeviceOptions::new("node1").in_dir(dir.path())).unwrap();
        let env = Env::new(dev, "node1", peer, "node2").expect("engine in the peer");
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let remote = env
            .peer
            .reg_mr(env.engine.dev, env.engine.pd, MIB, rw, FILL)
            .expect("peer mr");
        let pd = env.dev.alloc_pd().expect("pd");
        let local = env.mr(&pd, MIB, rw).expect("mr");
        let cq = env.dev.create_cq(64).expect("cq");
        Bed {
            _dir: dir,
            env,
            remote,
            pd,
            local,
            cq,
        }
    }

    /// A QP on the bed's CQ and the peer's QP (its id), our requests (and their responses)
    /// through a slow relay if `ours_slow`, the peer's requests if `theirs_slow`.
    fn connect(&self, ours_slow: bool, theirs_slow: bool) -> (SoftQp, u32) {
        let (env, rw) = (&self.env, Access::REMOTE_WRITE | Access::REMOTE_READ);
        let qp = env
            .dev
            .create_qp(&self.pd, &self.cq, &self.cq, QpCaps::default())
            .unwrap();
        qp.modify(QpTransition::Init { access: rw }).unwrap();
        let theirs = env
            .peer
            .create_qp(env.engine.dev, env.engine.pd, rw)
            .unwrap();
        let slowed = |slow: bool, ep: &Endpoint| match slow {
            true => through_slow_relay(ep),
            false => ep.clone(),
        };
        env.peer
            .rtr(theirs.id, &slowed(theirs_slow, &qp.endpoint()))
            .unwrap();
        let remote = slowed(ours_slow, &theirs.endpoint);
        qp.modify(QpTransition::Rtr { remote }).unwrap();
        qp.modify(QpTransition::Rts).unwrap();
        env.peer.rts(theirs.id).unwrap();
        (qp, theirs.id)
    }

    /// A caller waiting on the CQ for `n` completions, from before anything arrives, so it is
    /// the one driving the QPs; their ids and statuses, in order.
    fn waiter(&self, n: usize) -> mpsc::Receiver<(u64, WcStatus)> {
        let (tx, completions) = mpsc::channel();
        let cq = self.cq.clone();
        std::thread::spawn(move || {
            for _ in 0..n {
                let wc = cq.wait(Duration::from_secs(30)).expect("a completion");
                tx.send((wc.wr_id, wc.status)).unwrap();
            }
        });
        completions
    }

    fn byte(&self, offset: usize) -> u8 {
        let mut b = [0u8];
        // SAFETY: a byte of our own MR; a transfer may be writing it (a torn read is fine).
        unsafe { self.local.read_at(offset, &mut b) }.unwrap();
        b[0]
    }

    /// Waits until the first byte of our MR holds the peer's fill: a payload is landing.
    fn wait_for_landing(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.byte(0) != FILL {
            assert!(Instant::now() < deadline, "the payload never came");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A signaled 64-byte RDMA WRITE of ours to the peer.
    fn small_write(&self, qp: &SoftQp, wr_id: u64) {
        qp.post_send(SendWr {
            wr_id,
            op: SendOp::RdmaWrite {
                sge: Sge {
                    mr: &self.local,
                    offset: 0,
                    len: 64,
                },
                remote: self.remote_addr(),
            },
            signaled: true,
        })
        .unwrap();
    }

    fn remote_addr(&self) -> RemoteAddr {
        RemoteAddr {
            addr: self.remote.addr,
            rkey: self.remote.rkey,
        }
    }
}

#[test]
fn a_read_response_trickling_in_from_a_slow_peer_holds_no_other_qps_completion() {
    let bed = Bed::new();
    let (slow, _) = bed.connect(true, false);
    let (fast, _) = bed.connect(false, false);
    let completions = bed.waiter(2);
    slow.post_send(SendWr {
        wr_id: 1,
        op: SendOp::RdmaRead {
            sge: Sge {
                mr: &bed.local,
                offset: 0,
                len: MIB,
            },
            remote: bed.remote_addr(),
        },
        signaled: true,
    })
    .unwrap();
    bed.wait_for_landing();
    bed.small_write(&fast, 2);
    let order: Vec<_> = completions.iter().take(2).collect();
    assert_eq!(
        order,
        [(2, WcStatus::Success), (1, WcStatus::Success)],
        "the fast QP's WRITE must complete while the slow QP's READ is still arriving"
    );
    let mut landed = vec![0u8; MIB];
    // SAFETY: both work requests have completed.
    unsafe { bed.local.read_at(0, &mut landed) }.unwrap();
    assert!(landed.iter().all(|&b| b == FILL), "the READ landed whole");
}

#[test]
fn a_write_trickling_in_from_a_slow_peer_holds_no_other_qps_completion() {
    let bed = Bed::new();
    let (slow, slow_peer) = bed.connect(false, true);
    let (fast, _) = bed.connect(false, false);
    let completions = bed.waiter(1);
    let into_ours = PeerWr::Write {
        mr: bed.remote.id,
        offset: 0,
        len: MIB,
        remote: RemoteAddr {
            addr: bed.local.addr(),
            rkey: bed.local.rkey(),
        },
    };
    bed.env.peer.post(slow_peer, 1, into_ours).unwrap();
    bed.wait_for_landing();
    bed.small_write(&fast, 2);
    let first = completions.recv().unwrap();
    let last_landed = bed.byte(MIB - 1) == FILL;
    assert_eq!(first, (2, WcStatus::Success));
    assert!(
        !last_landed,
        "the fast QP's WRITE completed only once the peer's WRITE to the slow QP had landed"
    );
    let peer_wrote = bed.env.peer_status(slow_peer).unwrap();
    assert_eq!(peer_wrote, WcStatus::Success);
    assert_eq!(bed.byte(MIB - 1), FILL, "the peer's WRITE landed whole");
    drop(slow);
}
