//! A peer behind a slow link must not slow the other QPs of a completion queue. A caller
//! waiting on a CQ drives every QP of it (it reads their responses in its own thread); if it
//! waited there for a READ response's payload trickling in from a slow peer, every other QP's
//! completions would wait too, as an engine's requests from every node waited behind one node
//! with a delayed link (docs/reliability.md, "Chaos across nodes").

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dpufs_fabric::conformance::{Env, Peer};
use dpufs_fabric::soft::{DeviceOptions, SoftDevice};
use dpufs_fabric::{
    Access, CompletionQueue, Endpoint, MemoryRegion, QpCaps, QpTransition, QueuePair, RdmaDevice,
    RemoteAddr, SendOp, SendWr, Sge, WcStatus,
};

const MIB: usize = 1 << 20;
/// The slow link's pace towards us: a piece every [`PACE`].
const PIECE: usize = 16 << 10;
const PACE: Duration = Duration::from_millis(20);

/// A TCP relay to `target` for one connection: bytes towards the peer pass at once, bytes
/// from it [`PIECE`] per [`PACE`].
fn slow_relay(target: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (ours, _) = listener.accept().unwrap();
        let theirs = TcpStream::connect(target).unwrap();
        for s in [&ours, &theirs] {
            s.set_nodelay(true).unwrap();
        }
        let (mut up_from, mut up_to) = (ours.try_clone().unwrap(), theirs.try_clone().unwrap());
        std::thread::spawn(move || std::io::copy(&mut up_from, &mut up_to));
        let (mut down_from, mut down_to) = (theirs, ours);
        let mut buf = vec![0u8; PIECE];
        while let Ok(n @ 1..) = down_from.read(&mut buf) {
            if down_to.write_all(&buf[..n]).is_err() {
                break;
            }
            std::thread::sleep(PACE);
        }
    });
    addr
}

/// The TCP address of a soft device's endpoint (`tcp:<addr>/qp=…`), and the rest.
fn split(endpoint: &Endpoint) -> (SocketAddr, String) {
    let text = String::from_utf8(endpoint.0.clone()).unwrap();
    let rest = text.strip_prefix("tcp:").expect("a soft endpoint");
    let (addr, tail) = rest.split_once('/').expect("fields after the address");
    (addr.parse().unwrap(), tail.to_string())
}

/// `endpoint`, reached through a [`slow_relay`].
fn through_slow_relay(endpoint: &Endpoint) -> Endpoint {
    let (target, tail) = split(endpoint);
    Endpoint(format!("tcp:{}/{tail}", slow_relay(target)).into_bytes())
}

#[test]
fn a_read_trickling_in_from_a_slow_peer_holds_no_other_qps_completion() {
    let dir = common::device_dir("dpufs-fabric-slow");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric-peer"));
    cmd.arg(dir.path());
    let peer = Peer::spawn(cmd).expect("spawn peer");
    let dev = SoftDevice::open(&DeviceOptions::new("node1").in_dir(dir.path())).expect("open");
    let env = Env::new(dev, "node1", peer, "node2").expect("engine in the peer");
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let remote = env
        .peer
        .reg_mr(env.engine.dev, env.engine.pd, MIB, rw, 0x5a)
        .expect("peer mr");
    let pd = env.dev.alloc_pd().expect("pd");
    let local = env.mr(&pd, MIB, Access::LOCAL_WRITE).expect("mr");
    // Both QPs complete on one CQ; `slow` reaches the peer through the slow relay.
    let cq = env.dev.create_cq(64).expect("cq");
    let qp = |slow: bool| {
        let qp = env
            .dev
            .create_qp(&pd, &cq, &cq, QpCaps::default())
            .expect("qp");
        qp.modify(QpTransition::Init {
            access: Access::NONE,
        })
        .unwrap();
        let theirs = env
            .peer
            .create_qp(env.engine.dev, env.engine.pd, rw)
            .unwrap();
        env.peer.rtr(theirs.id, &qp.endpoint()).unwrap();
        let remote = match slow {
            true => through_slow_relay(&theirs.endpoint),
            false => theirs.endpoint.clone(),
        };
        qp.modify(QpTransition::Rtr { remote }).unwrap();
        qp.modify(QpTransition::Rts).unwrap();
        env.peer.rts(theirs.id).unwrap();
        qp
    };
    let (slow, fast) = (qp(true), qp(false));
    // A caller waits on the CQ from before the READ's response arrives, so it is the one
    // driving the slow QP when the response's header comes in.
    let (tx, completions) = mpsc::channel();
    let waiter = {
        let cq = cq.clone();
        std::thread::spawn(move || {
            for _ in 0..2 {
                let wc = cq.wait(Duration::from_secs(30)).expect("a completion");
                tx.send((wc.wr_id, wc.status)).unwrap();
            }
        })
    };
    let whole = Sge {
        mr: &local,
        offset: 0,
        len: MIB,
    };
    let from_peer = RemoteAddr {
        addr: remote.addr,
        rkey: remote.rkey,
    };
    slow.post_send(SendWr {
        wr_id: 1,
        op: SendOp::RdmaRead {
            sge: whole,
            remote: from_peer,
        },
        signaled: true,
    })
    .unwrap();
    // The payload starts landing: someone is reading it, and the rest takes ~1.3 s.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut first = [0u8];
        // SAFETY: a byte of our own MR; the READ may be writing it (a torn read is fine).
        unsafe { local.read_at(0, &mut first) }.unwrap();
        if first[0] == 0x5a {
            break;
        }
        assert!(Instant::now() < deadline, "the READ's payload never came");
        std::thread::sleep(Duration::from_millis(1));
    }
    let small = Sge {
        mr: &local,
        offset: 0,
        len: 64,
    };
    fast.post_send(SendWr {
        wr_id: 2,
        op: SendOp::RdmaWrite {
            sge: small,
            remote: from_peer,
        },
        signaled: true,
    })
    .unwrap();
    let order: Vec<_> = completions.iter().take(2).collect();
    waiter.join().unwrap();
    assert_eq!(
        order,
        [(2, WcStatus::Success), (1, WcStatus::Success)],
        "the fast QP's WRITE must complete while the slow QP's READ is still arriving"
    );
    let mut landed = vec![0u8; MIB];
    // SAFETY: both work requests have completed.
    unsafe { local.read_at(0, &mut landed) }.unwrap();
    assert!(
        landed[64..].iter().all(|&b| b == 0x5a),
        "the READ landed whole"
    );
}
