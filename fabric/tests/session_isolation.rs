//! Tenant isolation across real processes (issue 6, "Must show"). This process holds the
//! engine — a session server on node 2's software device — and, on node 1's device, the
//! attacking tenant's session. Victim tenants are `session-peer` processes on the same node-1
//! device (one rkey index space, as on one HCA), moving and checking data the whole time.
//!
//! Each attack must fail cleanly — the attacker's QP dies or its request is refused — while the
//! victim's concurrent transfers see no error and no wrong byte, and keep making progress.

mod common;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use dpufs_fabric::session::testing::{KvStore, LATE_FILL};
use dpufs_fabric::session::{
    AgentKey, Backoff, Bulk, Capability, Connection, Forgery, LeaseClaim, LeaseEventKind,
    LeaseRight, Rights, ServerConfig, SessionConfig, SessionError, SignedCapability, TenantSession,
    unix_now,
};
use dpufs_fabric::soft::{DeviceOptions, SoftDevice};
use dpufs_fabric::{inc_rkey, key_index};

/// Bound on every wait for another process.
const WAIT: Duration = Duration::from_secs(60);

/// The world of one test: device directory, node agent key, engine.
use common::KvBed as World;

impl World {
    fn new() -> World {
        World::start("dpufs-session-iso", ServerConfig::default())
    }

    fn claims(&self, tenant: &str) -> Capability {
        Capability::new(
            tenant,
            "vol",
            "pool",
            "cont",
            Rights::READ_WRITE,
            Duration::from_secs(600),
        )
    }

    fn cap(&self, tenant: &str) -> SignedCapability {
        self.agent.sign(&self.claims(tenant)).unwrap()
    }

    /// A tenant worker process on node 1, already moving data.
    fn tenant_process(&self, tenant: &str, seed: u8) -> Peer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_session-peer"))
            .arg(self.dir.path())
            .arg("node1")
            .arg(self.addr().to_string())
            .arg(self.cap(tenant).to_hex())
            .arg(seed.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn session-peer");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut peer = Peer {
            child,
            stdin,
            lines,
            pending: VecDeque::new(),
        };
        peer.expect("ready");
        peer
    }

    /// The attacker's session: a tenant worker in this process, on node 1.
    fn attacker(&self, config: SessionConfig) -> TenantSession<SoftDevice> {
        let dev = SoftDevice::open(&DeviceOptions::new("node1").in_dir(self.dir.path())).unwrap();
        TenantSession::open(dev, config).unwrap()
    }

    /// Waits until the server has counted `n` access errors.
    fn wait_access_errors(&self, n: u64) {
        let deadline = Instant::now() + WAIT;
        while self.server.server().stats().access_errors < n {
            assert!(
                Instant::now() < deadline,
                "server never saw {n} access errors"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn attacker_config() -> SessionConfig {
    SessionConfig {
        read_slots: 2,
        write_slots: 2,
        depth: 4,
        max_connections: 2,
        backoff: Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(20),
        },
        ..SessionConfig::default()
    }
}

/// A `session-peer` process and its answers.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    pending: VecDeque<String>,
}

#[derive(Debug)]
struct VictimStats {
    calls: u64,
    errors: u64,
    corrupt: u64,
    line: String,
}

impl Peer {
    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("write to session-peer");
        self.stdin.flush().unwrap();
    }

    /// The next line starting with `prefix` (other lines are kept for later).
    fn expect(&mut self, prefix: &str) -> String {
        if let Some(i) = self.pending.iter().position(|l| l.starts_with(prefix)) {
            return self.pending.remove(i).unwrap();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(line) if line.starts_with("failed") => panic!("session-peer: {line}"),
                Ok(line) => self.pending.push_back(line),
                Err(RecvTimeoutError::Timeout) => panic!("no {prefix:?} from session-peer"),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("session-peer exited before {prefix:?} ({:?})", self.pending)
                }
            }
        }
    }

    /// Rounds done so far, once at least `n`.
    fn rounds(&mut self, n: u64) -> u64 {
        self.send(&format!("wait {n}"));
        let line = self.expect("rounds ");
        line["rounds ".len()..].parse().unwrap()
    }

    /// Stops the loops and returns the tally.
    fn stop(mut self) -> VictimStats {
        self.send("stop");
        let line = self.expect("stats ");
        let field = |name: &str| -> u64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        };
        let stats = VictimStats {
            calls: field("calls="),
            errors: field("errors="),
            corrupt: field("corrupt="),
            line: line.clone(),
        };
        let _ = self.child.wait();
        stats
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `attack` while a victim tenant moves data, then checks the victim saw nothing.
fn with_victim(world: &World, attack: impl FnOnce(&mut Peer)) {
    let mut victim = world.tenant_process("victim", 0x5a);
    let before = victim.rounds(1);
    attack(&mut victim);
    // The victim keeps going after the attack.
    victim.rounds(before + 2);
    let stats = victim.stop();
    assert_eq!(
        (stats.errors, stats.corrupt),
        (0, 0),
        "victim disturbed: {}",
        stats.line
    );
    assert!(stats.calls > 0);
}

fn forged_get(
    conn: &Connection<SoftDevice>,
    key: &str,
    claim: LeaseClaim,
    bulk: Bulk<'_>,
) -> Result<(), SessionError> {
    let forgery = Forgery {
        request_id: None,
        lease: Some(claim),
        tag: None,
    };
    conn.call_forged(&KvStore::get(key), bulk, forgery, WAIT)
        .map(|_| ())
}

fn write_claim(rkey: u32, len: u32) -> LeaseClaim {
    LeaseClaim {
        rkey,
        addr: 0,
        len,
        right: LeaseRight::RemoteWrite,
    }
}

/// The rkey of the last window bind of `session`.
fn last_bind(session: &TenantSession<SoftDevice>) -> u32 {
    session
        .recent_leases()
        .iter()
        .rev()
        .find(|e| e.kind == LeaseEventKind::Bind)
        .expect("a bind")
        .rkey
}

fn assert_access_error(result: Result<(), SessionError>, what: &str) {
    match result {
        Err(SessionError::AccessError { .. }) => {}
        other => panic!("{what}: expected an RDMA access error, got {other:?}"),
    }
}

#[test]
fn guessed_rkeys_next_to_our_own_only_kill_the_guessers_qp() {
    let world = World::new();
    with_victim(&world, |_| {
        let session = world.attacker(attacker_config());
        let conn = session.connect(world.addr(), world.cap("mallory")).unwrap();
        conn.call(&KvStore::put("k"), Bulk::ToServer(&[1; 4096]))
            .unwrap();
        let mut buf = vec![0; 4096];
        conn.call(&KvStore::get("k"), Bulk::FromServer(&mut buf))
            .unwrap();
        let own = last_bind(&session);
        // mlx5-like keys step by 0x101 (index + 1, key byte + 1): the neighbours of our own key
        // are the objects allocated around ours, including the victim's on this device.
        let guesses = [
            own.wrapping_sub(0x101),
            own.wrapping_add(0x101),
            own.wrapping_sub(0x202),
        ];
        let mut qps = vec![conn.qp_num().unwrap()];
        for guess in guesses {
            assert_access_error(
                forged_get(&conn, "k", write_claim(guess, 4096), Bulk::None),
                &format!("guess {guess:#x}"),
            );
            assert!(!conn.is_connected(), "the guesser's QP is dead");
            let _ = conn.call(&KvStore::get("nothing"), Bulk::None);
            if let Some(qp) = conn.qp_num() {
                qps.push(qp);
            }
        }
        // Three access errors within a minute: our own session quarantines the server ...
        let stats = session.stats();
        assert_eq!((stats.access_errors, stats.quarantines), (3, 1));
        match conn.call(&KvStore::get("k"), Bulk::None) {
            Err(SessionError::Quarantined { errors: 3, .. }) => {}
            other => panic!("expected a quarantine, got {other:?}"),
        }
        // ... and the server quarantines the guessing tenant: a fresh session is refused.
        world.wait_access_errors(3);
        let fresh = world.attacker(attacker_config());
        match fresh.connect(world.addr(), world.cap("mallory")) {
            Err(SessionError::Refused { reason, .. }) => {
                assert!(reason.contains("quarantined"), "{reason}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let server = world.server.server().stats();
        assert_eq!((server.access_errors, server.quarantines), (3, 1));
        assert!(
            qps.windows(2).all(|w| w[0] != w[1]),
            "a new QP after each guess: {qps:?}"
        );
    });
}

#[test]
fn another_tenants_rkey_over_our_connection_is_refused() {
    let world = World::new();
    with_victim(&world, |victim| {
        let session = world.attacker(attacker_config());
        let conn = session.connect(world.addr(), world.cap("mallory")).unwrap();
        conn.call(&KvStore::put("k"), Bulk::ToServer(&[0xee; 65536]))
            .unwrap();
        // The victim has a call in flight: its window is bound, on its QP, right now.
        victim.send("hold h");
        let held = world
            .store
            .wait_arrival(WAIT)
            .expect("victim's held request");
        assert_eq!(held.tenant, "victim");
        let lease = held.lease.expect("victim's lease");
        // Confused deputy, both ways: ask the engine to write the victim's memory, and to read
        // it, naming the victim's live rkey over our own connection.
        assert_access_error(
            forged_get(&conn, "k", lease, Bulk::None),
            "writing through another tenant's rkey",
        );
        let steal = Forgery {
            request_id: None,
            lease: Some(LeaseClaim {
                right: LeaseRight::RemoteRead,
                ..lease
            }),
            tag: None,
        };
        let stolen = conn.call_forged(&KvStore::put("loot"), Bulk::None, steal, WAIT);
        assert!(
            stolen.is_err(),
            "reading through another tenant's rkey: {stolen:?}"
        );
        world.wait_access_errors(2);
        assert_eq!(world.store.value("mallory", "vol", "loot"), None);
        // The victim's call completes with its own data, untouched.
        world.store.release();
        let line = victim.expect("held ");
        assert_eq!(line, "held ok 65536 true");
    });
}

#[test]
fn stale_rkeys_after_invalidation_and_after_rotation_are_refused() {
    let world = World::new();
    with_victim(&world, |_| {
        // One window per connection, so every call rebinds the same window.
        let session = world.attacker(SessionConfig {
            depth: 1,
            ..attacker_config()
        });
        let conn = session.connect(world.addr(), world.cap("mallory")).unwrap();
        conn.call(&KvStore::put("k"), Bulk::ToServer(&[3; 8192]))
            .unwrap();
        let mut buf = vec![0; 8192];
        conn.call(&KvStore::get("k"), Bulk::FromServer(&mut buf))
            .unwrap();
        // After invalidation: the window is free; the stale handle finds it not VALID.
        let stale = last_bind(&session);
        let last = session.recent_leases().last().copied().unwrap();
        assert_eq!(
            (last.kind, last.rkey),
            (LeaseEventKind::RemoteInvalidate, stale)
        );
        assert_access_error(
            forged_get(&conn, "k", write_claim(stale, 8192), Bulk::None),
            "stale rkey after invalidation",
        );
        // After rotation: the call binds the window again with the next key byte, and names
        // the previous binding's rkey instead.
        conn.call(&KvStore::get("k"), Bulk::FromServer(&mut buf))
            .unwrap();
        let previous = last_bind(&session);
        let mut landing = vec![0; 8192];
        assert_access_error(
            forged_get(
                &conn,
                "k",
                write_claim(previous, 8192),
                Bulk::FromServer(&mut landing),
            ),
            "stale rkey after rotation",
        );
        let rotated = last_bind(&session);
        assert_eq!(rotated, inc_rkey(previous), "same window, next key byte");
        assert_eq!(key_index(rotated), key_index(previous));
        assert!(landing.iter().all(|&b| b == 0), "nothing landed");
        world.wait_access_errors(2);
    });
}

#[test]
fn a_replayed_request_is_refused_without_rma() {
    let world = World::new();
    with_victim(&world, |_| {
        let session = world.attacker(attacker_config());
        let conn = session.connect(world.addr(), world.cap("mallory")).unwrap();
        conn.call(&KvStore::put("k"), Bulk::ToServer(&[9; 4096]))
            .unwrap();
        let mut buf = vec![0; 4096];
        conn.call(&KvStore::get("k"), Bulk::FromServer(&mut buf))
            .unwrap();
        let handled = world.store.handled("mallory");
        // Request ids 1 and 2 were used: replay id 2 (and id 1) with a fresh, valid lease.
        for id in [2, 1] {
            let mut landing = vec![0; 4096];
            let replay = Forgery {
                request_id: Some(id),
                lease: None,
                tag: None,
            };
            match conn.call_forged(
                &KvStore::get("k"),
                Bulk::FromServer(&mut landing),
                replay,
                WAIT,
            ) {
                Err(SessionError::RequestRefused { reason }) => {
                    assert!(reason.contains("replayed"), "{reason}")
                }
                other => panic!("replay of id {id}: expected a refusal, got {other:?}"),
            }
            assert!(landing.iter().all(|&b| b == 0), "no RMA for a replay");
        }
        assert_eq!(
            world.store.handled("mallory"),
            handled,
            "the handler never ran"
        );
        let server = world.server.server().stats();
        assert_eq!(server.replays_refused, 2);
        // The connection is fine: refusals cost no QP.
        let r = conn
            .call(&KvStore::get("k"), Bulk::FromServer(&mut buf))
            .unwrap();
        assert_eq!(r.bulk_len, 4096);
        assert_eq!((session.stats().reconnects, server.access_errors), (0, 0));
    });
}

/// Connects `session` to `world`'s server presenting `cap`, which must be refused with a
/// reason that mentions `expect`.
fn assert_refused(
    world: &World,
    session: &TenantSession<SoftDevice>,
    cap: SignedCapability,
    expect: &str,
) {
    match session.connect(world.addr(), cap) {
        Err(SessionError::Refused { reason, .. }) => {
            assert!(
                reason.contains(expect),
                "{reason:?} should mention {expect:?}"
            )
        }
        other => panic!("expected a refusal mentioning {expect:?}, got {other:?}"),
    }
}

/// A second request on a tag whose reply the engine has not sent yet is a protocol error: the
/// connection dies before any handler sees it (two workers would write one reply slot at
/// once), and the victim tenant is undisturbed.
#[test]
fn a_second_request_on_a_tag_still_being_answered_kills_the_connection() {
    let world = World::new();
    with_victim(&world, |_| {
        let session = world.attacker(attacker_config());
        let conn = session.connect(world.addr(), world.cap("mallory")).unwrap();
        conn.call(&KvStore::put("k"), Bulk::ToServer(&[3; 4096]))
            .unwrap();
        let before = world.server.server().stats().protocol_errors;
        std::thread::scope(|s| {
            // A call's tag is the first free one: 0, as the put's was.
            let held = s.spawn(|| {
                let mut out = vec![0; 4096];
                conn.call(&KvStore::hold("k"), Bulk::FromServer(&mut out))
            });
            world
                .store
                .wait_arrival(WAIT)
                .expect("the held request reached its handler");
            let dup = Forgery {
                tag: Some(0),
                ..Forgery::default()
            };
            let second =
                conn.call_forged(&KvStore::put("dup"), Bulk::ToServer(&[4; 16]), dup, WAIT);
            assert!(
                second.is_err(),
                "a second request on tag 0 was answered: {second:?}"
            );
            world.store.release();
            assert!(
                held.join().unwrap().is_err(),
                "the connection died under it"
            );
        });
        assert_eq!(
            world.store.value("mallory", "vol", "dup"),
            None,
            "no handler ran for the second request"
        );
        let server = world.server.server().stats();
        assert_eq!(server.protocol_errors, before + 1);
    });
}

#[test]
fn expired_and_forged_capabilities_are_refused_at_the_handshake() {
    let world = World::new();
    with_victim(&world, |_| {
        let established = world.server.server().stats().connections;
        let session = world.attacker(attacker_config());
        let refused = |cap, expect| assert_refused(&world, &session, cap, expect);
        let mut expired = world.claims("mallory");
        expired.not_after = unix_now() - 3600;
        refused(world.agent.sign(&expired).unwrap(), "expired");
        let rogue = AgentKey::generate().unwrap();
        refused(
            rogue.sign(&world.claims("victim")).unwrap(),
            "unknown agent key",
        );
        // Widen a genuine read-only capability: the signature no longer verifies.
        let mut ro = world.claims("mallory");
        ro.rights = Rights::READ_ONLY;
        let genuine = world.agent.sign(&ro).unwrap();
        let widened = SignedCapability::from_parts(
            genuine.key_id().to_owned(),
            world.claims("mallory").encode().unwrap(),
            genuine.signature().to_vec(),
        );
        refused(widened, "does not verify");
        // Valid, but for two days: longer than the server's maximum (a day by default).
        let mut too_long = world.claims("mallory");
        too_long.not_after = unix_now() + 2 * 24 * 3600;
        refused(world.agent.sign(&too_long).unwrap(), "accepts at most");
        let server = world.server.server().stats();
        assert_eq!(server.refused_handshakes, 4);
        assert_eq!(
            server.connections, established,
            "no QP for a refused handshake"
        );
        assert_eq!(world.server.server().connections(), 1, "only the victim's");
    });
}

/// A tenant at the server's per-tenant connection cap is refused one more, with a reason that
/// names the cap, while another tenant connects and is served beside it.
#[test]
fn a_tenant_at_its_connection_cap_is_refused_one_more_and_others_are_not() {
    let config = ServerConfig {
        max_connections_per_tenant: 2,
        ..ServerConfig::default()
    };
    let world = World::start("dpufs-session-cap", config);
    with_victim(&world, |_| {
        // Each session is a worker of its own; mallory's two fill its cap.
        let mallory: Vec<_> = (0..3).map(|_| world.attacker(attacker_config())).collect();
        let _held: Vec<_> = mallory[..2]
            .iter()
            .map(|s| s.connect(world.addr(), world.cap("mallory")).unwrap())
            .collect();
        assert_refused(
            &world,
            &mallory[2],
            world.cap("mallory"),
            "tenant \"mallory\" has its maximum of 2 connections",
        );
        // Another tenant is not counted against mallory's cap.
        let other = world.attacker(attacker_config());
        let conn = other.connect(world.addr(), world.cap("trent")).unwrap();
        conn.call(&KvStore::put("k"), Bulk::ToServer(&[7; 4096]))
            .unwrap();
        assert_eq!(
            world.server.server().connections(),
            4,
            "victim, mallory ×2, trent"
        );
    });
}

/// Handshakes of one tenant started at once cannot pass the per-tenant cap together: the check
/// and the count are one step, although each handshake takes round trips before its
/// connection is in the server's table.
#[test]
fn handshakes_racing_for_a_tenants_last_connection_get_no_more_than_its_cap() {
    let config = ServerConfig {
        max_connections_per_tenant: 2,
        ..ServerConfig::default()
    };
    let world = World::start("dpufs-session-cap-race", config);
    with_victim(&world, |_| {
        let mallory: Vec<_> = (0..8).map(|_| world.attacker(attacker_config())).collect();
        let start = std::sync::Barrier::new(mallory.len());
        let world = &world;
        let connected: Vec<_> = std::thread::scope(|s| {
            let tries: Vec<_> = mallory
                .iter()
                .map(|session| {
                    let cap = world.cap("mallory");
                    let start = &start;
                    s.spawn(move || {
                        start.wait();
                        session.connect(world.addr(), cap)
                    })
                })
                .collect();
            tries.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let held = connected.iter().filter(|c| c.is_ok()).count();
        assert_eq!(held, 2, "mallory's cap is 2 connections");
        assert_eq!(
            world.server.server().connections(),
            3,
            "the victim and mallory's two"
        );
    });
}

/// A server that sends each reply twice costs the client nothing: the second is dropped and
/// its receive slot posted again (kept instead, each would take a slot for good, and after
/// `depth` calls the connection would have none left for replies).
#[test]
fn duplicate_replies_from_a_broken_server_cost_the_client_no_receive_slot() {
    let world = World::new();
    world.server.server().duplicate_replies();
    let session = world.attacker(attacker_config());
    let conn = session.connect(world.addr(), world.cap("trent")).unwrap();
    for i in 0..4 * attacker_config().depth {
        let value = [i as u8; 4096];
        let put = conn.call(&KvStore::put("k"), Bulk::ToServer(&value));
        assert_eq!(put.unwrap().message, b"ok", "put {i}");
        let mut back = [0u8; 4096];
        let get = conn.call(&KvStore::get("k"), Bulk::FromServer(&mut back));
        assert_eq!(get.unwrap().message, b"ok", "get {i}");
        assert_eq!(back, value, "get {i}");
    }
    assert_eq!(
        world.server.server().stats().connections,
        1,
        "all on the one connection"
    );
}

/// A connection whose requests all wait (here at the handler's gate; on a slow link, on their
/// RMA and replies) holds all of the server's workers but one: another tenant's calls are
/// served meanwhile, and the waiting requests run once the first ones end.
#[test]
fn a_connection_whose_requests_all_wait_leaves_a_worker_to_the_others() {
    let world = World::new();
    let workers = ServerConfig::default().workers;
    let calls = workers + 2;
    let slow_session = world.attacker(SessionConfig {
        depth: 8,
        ..attacker_config()
    });
    let slow = slow_session
        .connect(world.addr(), world.cap("mallory"))
        .unwrap();
    let other_session = world.attacker(attacker_config());
    let other = other_session
        .connect(world.addr(), world.cap("trent"))
        .unwrap();
    let ended = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..calls {
            s.spawn(|| {
                let _ = slow.call(&KvStore::hold("k"), Bulk::None);
                ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        for i in 1..workers {
            let arrived = world.store.wait_arrival(WAIT);
            assert!(arrived.is_some(), "held request {i} reached no worker");
        }
        let more = world.store.wait_arrival(Duration::from_millis(300));
        assert!(
            more.is_none(),
            "mallory's requests hold all {workers} workers: {more:?}"
        );
        let served = other.call(&KvStore::put("t"), Bulk::ToServer(&[1; 4096]));
        assert_eq!(served.unwrap().message, b"ok", "trent served beside them");
        // The gate lets through what waits at it; the rest arrive and are let through after.
        while ended.load(std::sync::atomic::Ordering::SeqCst) < calls {
            world.store.release();
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    assert_eq!(world.store.handled("mallory"), calls as u64);
}

#[test]
fn a_capability_captured_on_the_wire_cannot_be_presented_by_anyone_else() {
    let world = World::new();
    with_victim(&world, |_| {
        let established = world.server.server().stats().connections;
        let session = world.attacker(attacker_config());
        let refused = |cap, expect| assert_refused(&world, &session, cap, expect);
        // The victim's token as it crosses the network in a hello: signed, valid, for the
        // victim's tenant, and without the holder key, which never leaves the worker.
        let issued = world.cap("victim");
        let captured = SignedCapability::from_bytes(&issued.to_bytes()).unwrap();
        refused(captured, "no proof of holding");
        // Proved with a holder key of the attacker's own (from a token of its own).
        let issued_hex = issued.to_hex();
        let (wire, _) = issued_hex.split_once(':').unwrap();
        let mine = world.cap("mallory").to_hex();
        let (_, my_holder) = mine.split_once(':').unwrap();
        let rekeyed = SignedCapability::from_hex(&format!("{wire}:{my_holder}")).unwrap();
        refused(rekeyed, "does not verify for the capability's holder key");
        let server = world.server.server().stats();
        assert_eq!(server.refused_handshakes, 2);
        assert_eq!(server.connections, established, "no QP for either");
        // The token with its holder key, as issued, is served.
        session.connect(world.addr(), issued).unwrap();
    });
}

#[test]
fn a_live_connection_is_refused_past_its_capabilitys_expiry_until_a_renewed_one_is_presented() {
    // No skew allowed, so the test waits seconds, not a minute.
    let config = ServerConfig {
        clock_skew: Duration::ZERO,
        ..ServerConfig::default()
    };
    let world = World::start("dpufs-session-expiry", config);
    with_victim(&world, |_| {
        let session = world.attacker(attacker_config());
        let mut short = world.claims("mallory");
        short.not_after = unix_now() + 2;
        let conn = session
            .connect(world.addr(), world.agent.sign(&short).unwrap())
            .unwrap();
        let value = vec![0x5a; 4096];
        conn.call(&KvStore::put("k"), Bulk::ToServer(&value))
            .unwrap();
        let first_qp = conn.qp_num();
        while unix_now() <= short.not_after {
            std::thread::sleep(Duration::from_millis(100));
        }
        // The handshake checked the capability once; the connection does not outlive it.
        let mut buf = vec![0; 4096];
        match conn.call(&KvStore::get("k"), Bulk::FromServer(&mut buf)) {
            Err(SessionError::RequestRefused { reason }) => {
                assert!(reason.contains("capability expired"), "{reason}")
            }
            other => panic!("a call past the capability's expiry: {other:?}"),
        }
        assert_eq!(buf, vec![0; 4096], "nothing was moved");
        // The node agent's renewal reaches the worker: the next call moves to a new QP
        // that presents it, and is served.
        conn.renew(world.cap("mallory"));
        let r = conn
            .call(&KvStore::get("k"), Bulk::FromServer(&mut buf))
            .unwrap();
        assert_eq!((r.bulk_len, &buf), (4096, &value));
        assert_ne!(conn.qp_num(), first_qp);
        assert_eq!(session.stats().rotations, 1);
        assert!(world.server.server().stats().requests_refused >= 1);
    });
}

#[test]
fn a_renewed_capability_moves_the_connection_before_it_is_needed() {
    let world = World::new();
    let session = world.attacker(attacker_config());
    let conn = session.connect(world.addr(), world.cap("mallory")).unwrap();
    let value = vec![7; 4096];
    conn.call(&KvStore::put("k"), Bulk::ToServer(&value))
        .unwrap();
    let first_qp = conn.qp_num();
    // The same token again (a second mount, an unchanged file) moves nothing.
    let same = world.cap("mallory");
    conn.renew(same.clone());
    conn.call(&KvStore::put("k"), Bulk::ToServer(&value))
        .unwrap();
    conn.renew(same);
    conn.call(&KvStore::put("k"), Bulk::ToServer(&value))
        .unwrap();
    assert_eq!(session.stats().rotations, 1, "one move for one new token");
    assert_ne!(conn.qp_num(), first_qp);
    assert_eq!(session.stats().failed_calls, 0);
    assert_eq!(session.stats().reconnects, 0, "a move is not a failure");
}

#[test]
fn a_late_rma_after_a_timeout_fails_and_never_lands_in_a_reused_slot() {
    let world = World::new();
    with_victim(&world, |_| {
        // One landing slot: any later read necessarily reuses the timed-out call's slot.
        let session = world.attacker(SessionConfig {
            read_slots: 1,
            ..attacker_config()
        });
        let conn = session
            .connect(world.addr(), world.cap("slowpoke"))
            .unwrap();
        let value: Vec<u8> = (0..65536).map(|i| (i % 100) as u8).collect();
        conn.call(&KvStore::put("k"), Bulk::ToServer(&value))
            .unwrap();
        let mut landing = vec![0; 65536];
        let late = conn.call_timeout(
            &KvStore::late("k"),
            Bulk::FromServer(&mut landing),
            Duration::from_millis(300),
        );
        assert!(
            matches!(late, Err(SessionError::Timeout { .. })),
            "{late:?}"
        );
        let revoked = session.recent_leases().last().copied().unwrap();
        assert_eq!(revoked.kind, LeaseEventKind::Revoke);
        // The engine wakes up and pushes into the revoked window: refused by our NIC checks.
        world.store.release();
        world.wait_access_errors(1);
        // The next read reuses the slot and gets exactly its own data.
        let mut back = vec![0; 65536];
        let r = conn
            .call(&KvStore::get("k"), Bulk::FromServer(&mut back))
            .unwrap();
        assert_eq!(r.bulk_len, value.len());
        assert_eq!(back, value);
        assert!(!landing.contains(&LATE_FILL) && !back.contains(&LATE_FILL));
        let stats = session.stats();
        assert_eq!(stats.timeouts, 1);
        // Explained by our own timeout: counted, not held against the server.
        assert_eq!(
            (
                stats.late_rma_errors,
                stats.access_errors,
                stats.quarantines
            ),
            (1, 0, 0)
        );
    });
}

#[test]
fn two_tenants_share_one_device_and_each_sees_only_its_own_data() {
    let world = World::new();
    let mut alpha = world.tenant_process("alpha", 1);
    let mut beta = world.tenant_process("beta", 2);
    // Both write and read the same key names at the same time, through one node-1 device.
    for peer in [&mut alpha, &mut beta] {
        peer.send("wait 6");
    }
    for peer in [&mut alpha, &mut beta] {
        peer.expect("rounds ");
    }
    let (a, b) = (alpha.stop(), beta.stop());
    for stats in [&a, &b] {
        assert_eq!((stats.errors, stats.corrupt), (0, 0), "{}", stats.line);
        assert!(stats.calls >= 12, "{}", stats.line);
    }
    let va = world
        .store
        .value("alpha", "vol", "k0")
        .expect("alpha's data");
    let vb = world.store.value("beta", "vol", "k0").expect("beta's data");
    assert_ne!(va, vb, "one key name, two tenants, two values");
    assert_eq!(world.server.server().stats().access_errors, 0);
}
