//! The same-device path across two real processes: a peer opening the device of this process
//! (two contexts of one node's NIC) is reached over a unix socket, and RDMA payloads move by
//! one copy between the registered buffers; a peer on another device is reached over TCP.
//! Both must move the same bytes.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use dpufs_fabric::conformance::{Env, Link, Peer, PeerMr, PeerWr};
use dpufs_fabric::soft::{DeviceOptions, SoftDevice, SoftMr};
use dpufs_fabric::{
    Access, CompletionQueue, MemoryRegion, MemoryWindow, QueuePair, RdmaDevice, RemoteAddr, SendOp,
    SendWr, Sge, WcStatus, inc_rkey,
};

const MIB: usize = 1 << 20;

struct Linked {
    _dir: tempfile::TempDir,
    env: Env<SoftDevice>,
    /// A 2 MiB MR of the engine, filled with 0x5a.
    remote: PeerMr,
    link: Link<SoftDevice>,
    /// Two local buffers, so the peer is handed more than one.
    bufs: [SoftMr; 2],
}

/// This process on device "node1" (its directory), the peer's engine context on
/// `peer_device`.
fn env(peer_device: &str) -> (tempfile::TempDir, Env<SoftDevice>) {
    let dir = common::device_dir("dpufs-fabric-same");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric-peer"));
    cmd.arg(dir.path());
    let peer = Peer::spawn(cmd).expect("spawn peer");
    let dev = SoftDevice::open(&DeviceOptions::new("node1").in_dir(dir.path())).expect("open");
    let env = Env::new(dev, "node1", peer, peer_device).expect("engine in the peer");
    (dir, env)
}

/// [`env`] with a link and buffers.
fn link(peer_device: &str) -> Linked {
    let (dir, env) = env(peer_device);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let remote = env
        .peer
        .reg_mr(env.engine.dev, env.engine.pd, 2 * MIB, rw, 0x5a)
        .expect("peer mr");
    let pd = env.dev.alloc_pd().expect("pd");
    let bufs = [0, 1].map(|_| env.mr(&pd, MIB, Access::LOCAL_WRITE).expect("mr"));
    let link = env.link(&pd, Access::NONE).expect("link");
    Linked {
        _dir: dir,
        env,
        remote,
        link,
        bufs,
    }
}

impl Linked {
    /// One signalled RDMA op of a whole local buffer at `remote_offset`; its status.
    fn rma(&self, write: bool, buf: usize, remote_offset: u64) -> WcStatus {
        let sge = Sge {
            mr: &self.bufs[buf],
            offset: 0,
            len: MIB,
        };
        let remote = RemoteAddr {
            addr: self.remote.addr + remote_offset,
            rkey: self.remote.rkey,
        };
        self.link
            .qp
            .post_send(SendWr {
                wr_id: 1,
                op: SendOp::rdma(write, sge, remote),
                signaled: true,
            })
            .expect("post");
        self.link
            .send_cq
            .wait(Duration::from_secs(10))
            .expect("completion")
            .status
    }
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..MIB)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn moves_the_same_bytes(peer_device: &str, same_device: bool) {
    let l = link(peer_device);
    assert_eq!(
        l.link.qp.same_device(),
        same_device,
        "peer on {peer_device}"
    );
    // READ: the peer's fill lands in our buffer.
    assert_eq!(l.rma(false, 0, 0), WcStatus::Success);
    let mut got = vec![0u8; MIB];
    // SAFETY: one thread; the READ has completed.
    unsafe { l.bufs[0].read_at(0, &mut got) }.unwrap();
    assert!(got.iter().all(|&b| b == 0x5a), "READ did not land");
    // WRITE from both buffers to both halves of the peer's MR.
    for (buf, seed) in [(0usize, 1u8), (1, 2)] {
        // SAFETY: one thread; nothing is posted on the buffer.
        unsafe { l.bufs[buf].write_at(0, &pattern(seed)) }.unwrap();
        assert_eq!(l.rma(true, buf, (buf * MIB) as u64), WcStatus::Success);
        let landed = l.env.peer.read_mr(l.remote.id, buf * MIB, MIB).unwrap();
        assert!(
            landed == pattern(seed),
            "WRITE from buffer {buf} did not land"
        );
    }
    // READ the second half back into the first buffer.
    assert_eq!(l.rma(false, 0, MIB as u64), WcStatus::Success);
    // SAFETY: one thread; the READ has completed.
    unsafe { l.bufs[0].read_at(0, &mut got) }.unwrap();
    assert!(got == pattern(2), "READ back did not land");
    // The checks still hold: beyond the MR is a remote access error.
    assert_eq!(l.rma(true, 0, (2 * MIB) as u64), WcStatus::RemAccessErr);
}

#[test]
fn a_peer_on_the_same_device_gets_payloads_by_reference() {
    moves_the_same_bytes("node1", true);
}

#[test]
fn a_peer_on_another_device_gets_payloads_over_tcp() {
    moves_the_same_bytes("node2", false);
}

/// A long run of unsignaled WRITEs, several times the send queue's depth, then one signaled:
/// the unsignaled ones must leave the queue as their ACKs arrive (or posting stalls for good),
/// without a completion of their own. Exactly one completion appears, and every byte lands.
fn unsignaled_writes_retire(peer_device: &str) {
    const PIECE: usize = 4096;
    const WRITES: usize = 3 * 128 + 7;
    let l = link(peer_device);
    let bytes = pattern(9);
    // SAFETY: one thread; nothing is posted on the buffer yet.
    unsafe { l.bufs[0].write_at(0, &bytes) }.unwrap();
    let post = |i: usize, signaled: bool| {
        let offset = (i * PIECE) % MIB;
        let wr = || SendWr {
            wr_id: i as u64,
            op: SendOp::RdmaWrite {
                sge: Sge {
                    mr: &l.bufs[0],
                    offset,
                    len: PIECE,
                },
                remote: RemoteAddr {
                    addr: l.remote.addr + offset as u64,
                    rkey: l.remote.rkey,
                },
            },
            signaled,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while let Err(e) = l.link.qp.post_send(wr()) {
            assert!(
                std::time::Instant::now() < deadline,
                "send queue never drained: {e}"
            );
            // Polling drives the QP: ACKs that arrived retire entries.
            assert_eq!(l.link.send_cq.poll(&mut []), 0);
            std::thread::sleep(Duration::from_micros(100));
        }
    };
    for i in 0..WRITES {
        post(i, false);
    }
    post(WRITES, true);
    let wc = l
        .link
        .send_cq
        .wait(Duration::from_secs(10))
        .expect("the signaled WRITE completes");
    assert_eq!((wc.wr_id, wc.status), (WRITES as u64, WcStatus::Success));
    assert!(
        l.link.send_cq.wait(Duration::from_millis(100)).is_none(),
        "unsignaled WRITEs completed visibly"
    );
    let landed = l.env.peer.read_mr(l.remote.id, 0, MIB).unwrap();
    assert!(landed == bytes, "unsignaled WRITEs did not land");
}

#[test]
fn unsignaled_writes_retire_on_the_same_device() {
    unsignaled_writes_retire("node1");
}

#[test]
fn unsignaled_writes_retire_over_tcp() {
    unsignaled_writes_retire("node2");
}

/// The peer RDMA-WRITEs 64 MiB into a window of ours, and we post LOCAL_INV of the window once
/// the first bytes have landed. The WRITE passed the window's checks, so it lands whole, and the
/// invalidation must complete only after it has: a NIC's invalidation fences the DMA already
/// under way, and memory taken back at the completion must not be written by a late payload.
/// (Before the fix, the LOCAL_INV completed at once while the payload went on landing.)
fn an_invalidation_waits_for_the_write_in_progress(peer_device: &str) {
    const LEN: usize = 64 * MIB;
    let (_dir, env) = env(peer_device);
    let source = env
        .peer
        .reg_mr(
            env.engine.dev,
            env.engine.pd,
            LEN,
            Access::LOCAL_WRITE,
            0x5a,
        )
        .expect("peer mr");
    let pd = env.dev.alloc_pd().expect("pd");
    let mr = env
        .mr(&pd, LEN, Access::LOCAL_WRITE | Access::MW_BIND)
        .expect("mr");
    let link = env.link(&pd, Access::REMOTE_WRITE).expect("link");
    let mw = env.dev.alloc_mw(&pd).expect("mw");
    let rkey = inc_rkey(mw.rkey());
    let bound = env.bind(&link, &mw, &mr, rkey, 0, LEN as u64, Access::REMOTE_WRITE);
    assert_eq!(bound.expect("bind"), WcStatus::Success);
    let write = PeerWr::Write {
        mr: source.id,
        offset: 0,
        len: LEN,
        remote: env.window_at(&mw, &mr, 0),
    };
    env.peer
        .post(link.peer_qp, 1, write)
        .expect("post the WRITE");
    let byte = |offset: usize| {
        let mut b = [0u8];
        // SAFETY: plain bytes of our own MR; the peer may be writing them (a torn read is fine).
        unsafe { mr.read_at(offset, &mut b) }.unwrap();
        b[0]
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while byte(0) != 0x5a {
        assert!(Instant::now() < deadline, "the WRITE never began to land");
        std::hint::spin_loop();
    }
    let invalidated = env.local_inv(&link, rkey).expect("LOCAL_INV");
    let last = byte(LEN - 1);
    assert_eq!(invalidated, WcStatus::Success);
    assert_eq!(
        last, 0x5a,
        "LOCAL_INV completed while the peer's WRITE was still landing in the window"
    );
    assert_eq!(env.peer_status(link.peer_qp).unwrap(), WcStatus::Success);
}

#[test]
fn an_invalidation_waits_for_a_same_device_write_in_progress() {
    an_invalidation_waits_for_the_write_in_progress("node1");
}

#[test]
fn an_invalidation_waits_for_a_write_in_progress_over_tcp() {
    an_invalidation_waits_for_the_write_in_progress("node2");
}
