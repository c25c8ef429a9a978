//! Tenant sessions doing their job: calls with and without bulk data in both directions, many
//! threads on one connection, both invalidation modes, caps, refusals, reconnects. Server and
//! worker run in this process, each on its own context of its own node's software device.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use dpufs_fabric::session::testing::KvStore;
use dpufs_fabric::session::{
    Bulk, Capability, Forgery, Invalidation, LeaseClaim, LeaseEventKind, LeaseRight, Limits,
    MAX_CONTROL_MESSAGE, MAX_HANDSHAKES, PROTOCOL_VERSION, Rights, RunningServer, ServerConfig,
    SessionConfig, SessionError, SignedCapability, TenantSession,
};
use dpufs_fabric::soft::{DeviceOptions, SoftDevice};

use common::KvBed as Bed;

/// Another server on node 2 of `bed`'s directory, trusting the same agent.
fn second_server(bed: &Bed) -> RunningServer<SoftDevice> {
    common::kv_server(
        bed.dir.path(),
        &bed.agent,
        &bed.store,
        ServerConfig::default(),
    )
}

impl Bed {
    fn new(config: ServerConfig) -> Bed {
        Bed::start("dpufs-session-test", config)
    }

    fn cap(&self, tenant: &str, rights: Rights) -> SignedCapability {
        let claims = Capability::new(
            tenant,
            "vol",
            "pool",
            "cont",
            rights,
            Duration::from_secs(600),
        );
        self.agent.sign(&claims).unwrap()
    }

    fn session(&self, config: SessionConfig) -> TenantSession<SoftDevice> {
        let dev = SoftDevice::open(&DeviceOptions::new("node1").in_dir(self.dir.path())).unwrap();
        TenantSession::open(dev, config).unwrap()
    }
}

fn small() -> SessionConfig {
    SessionConfig {
        slot_size: 1 << 20,
        read_slots: 4,
        write_slots: 4,
        depth: 8,
        max_connections: 2,
        ..SessionConfig::default()
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect()
}

fn round_trip(invalidation: Invalidation) {
    let bed = Bed::new(ServerConfig::default());
    let session = bed.session(SessionConfig {
        invalidation,
        ..small()
    });
    let conn = session
        .connect(bed.addr(), bed.cap("acme", Rights::READ_WRITE))
        .unwrap();
    for len in [1, 4096, 1 << 20] {
        let data = pattern(len as u8, len);
        let r = conn
            .call(&KvStore::put("k"), Bulk::ToServer(&data))
            .unwrap();
        assert_eq!(r.message, b"ok");
        let mut back = vec![0; 1 << 20];
        let r = conn
            .call(&KvStore::get("k"), Bulk::FromServer(&mut back))
            .unwrap();
        assert_eq!((r.message.as_slice(), r.bulk_len), (&b"ok"[..], len));
        assert_eq!(&back[..len], &data[..]);
    }
    let r = conn.call(&KvStore::get("missing"), Bulk::None).unwrap();
    assert_eq!(r.message, b"none");
    let stats = session.stats();
    assert_eq!(stats.binds, 6);
    let (remote, local) = match invalidation {
        Invalidation::WithReply => (6, 0),
        Invalidation::Local => (0, 6),
    };
    assert_eq!(
        (stats.remote_invalidations, stats.local_invalidations),
        (remote, local)
    );
    assert_eq!(stats.access_errors + stats.timeouts + stats.failed_calls, 0);
    // The ring buffer shows each bind followed by its invalidation, with rotating key bytes.
    let events = session.recent_leases();
    assert_eq!(events.len(), 12);
    assert!(events.chunks(2).all(|p| p[0].kind == LeaseEventKind::Bind
        && p[1].kind != LeaseEventKind::Bind
        && p[0].rkey == p[1].rkey));
}

#[test]
fn round_trips_with_invalidation_by_the_reply() {
    round_trip(Invalidation::WithReply);
}

#[test]
fn round_trips_with_local_invalidation() {
    round_trip(Invalidation::Local);
}

#[test]
fn many_threads_pipeline_calls_on_one_connection() {
    let bed = Bed::new(ServerConfig::default());
    let session = bed.session(small());
    let conn = session
        .connect(bed.addr(), bed.cap("acme", Rights::READ_WRITE))
        .unwrap();
    let threads = 8;
    let rounds = 40;
    std::thread::scope(|s| {
        for t in 0..threads {
            let conn = conn.clone();
            s.spawn(move || {
                let key = format!("key-{t}");
                let mut back = vec![0; 64 << 10];
                for round in 0..rounds {
                    let len = if round % 2 == 0 { 4096 } else { 64 << 10 };
                    let data = pattern((t * 31 + round) as u8, len);
                    let r = conn
                        .call(&KvStore::put(&key), Bulk::ToServer(&data))
                        .unwrap();
                    assert_eq!(r.message, b"ok");
                    let r = conn
                        .call(&KvStore::get(&key), Bulk::FromServer(&mut back))
                        .unwrap();
                    assert_eq!(r.bulk_len, len);
                    assert_eq!(&back[..len], &data[..], "thread {t} round {round}");
                }
            });
        }
    });
    let stats = session.stats();
    assert_eq!(stats.calls, (threads * rounds * 2) as u64);
    assert_eq!(stats.failed_calls, 0);
    assert_eq!(bed.server.server().stats().requests, stats.calls);
}

#[test]
fn caps_refuse_what_exceeds_the_tenant_limits() {
    let bed = Bed::new(ServerConfig::default());
    let dev = || SoftDevice::open(&DeviceOptions::new("node1").in_dir(bed.dir.path())).unwrap();
    let limited = |limits: Limits| SessionConfig { limits, ..small() };
    let err = TenantSession::open(
        dev(),
        limited(Limits {
            max_registered_bytes: 1 << 20,
            ..Limits::default()
        }),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::LimitExceeded {
                resource: "registered_bytes",
                ..
            }
        ),
        "{err}"
    );
    let err = TenantSession::open(
        dev(),
        limited(Limits {
            max_mrs: 2,
            ..Limits::default()
        }),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::LimitExceeded {
                resource: "mrs",
                ..
            }
        ),
        "{err}"
    );
    // Windows: one connection takes `depth` of them.
    let other = second_server(&bed);
    let session = TenantSession::open(
        dev(),
        SessionConfig {
            connect_timeout: Duration::from_millis(200),
            ..limited(Limits {
                max_windows: 8,
                ..Limits::default()
            })
        },
    )
    .unwrap();
    let cap = bed.cap("acme", Rights::READ_WRITE);
    let _held = session.connect(bed.addr(), cap.clone()).unwrap();
    let err = session
        .connect(other.server().local_addr(), cap.clone())
        .unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::LimitExceeded {
                resource: "windows",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("raise the limit"), "{err}");
    // QPs: one connection's control buffers are registered.
    let session = TenantSession::open(
        dev(),
        SessionConfig {
            max_connections: 1,
            connect_timeout: Duration::from_millis(200),
            ..small()
        },
    )
    .unwrap();
    let _first = session.connect(bed.addr(), cap.clone()).unwrap();
    let err = session
        .connect(other.server().local_addr(), cap)
        .unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::LimitExceeded {
                resource: "qps",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn oversized_messages_and_missing_rights_are_refused_without_rma() {
    let bed = Bed::new(ServerConfig {
        max_bulk: 64 << 10,
        ..ServerConfig::default()
    });
    let session = bed.session(small());
    let conn = session
        .connect(bed.addr(), bed.cap("reader", Rights::READ_ONLY))
        .unwrap();
    let big = vec![0u8; MAX_CONTROL_MESSAGE + 1];
    let err = conn.call(&big, Bulk::None).unwrap_err();
    assert!(matches!(err, SessionError::MessageTooLarge { .. }), "{err}");
    // The server offered 64 KiB bulk transfers: the connection keeps to that.
    let data = vec![1u8; (64 << 10) + 1];
    let err = conn
        .call(&KvStore::put("k"), Bulk::ToServer(&data))
        .unwrap_err();
    assert!(
        matches!(err, SessionError::BulkTooLarge { max: 65536, .. }),
        "{err}"
    );
    // A read-only capability cannot write.
    let err = conn
        .call(&KvStore::put("k"), Bulk::ToServer(&data[..10]))
        .unwrap_err();
    match &err {
        SessionError::RequestRefused { reason } => assert!(reason.contains("no write"), "{reason}"),
        other => panic!("expected a refusal, got {other}"),
    }
    assert_eq!(bed.store.handled("reader"), 0, "refused before the handler");
    // The window was invalidated by the worker itself (the refusal carries no invalidation)
    // and the connection is fine.
    assert_eq!(session.stats().local_invalidations, 1);
    assert_eq!(
        conn.call(&KvStore::get("k"), Bulk::None).unwrap().message,
        b"none"
    );
    assert_eq!(session.stats().reconnects, 0);
}

#[test]
fn a_dead_qp_is_replaced_by_the_next_call() {
    let bed = Bed::new(ServerConfig::default());
    let session = bed.session(small());
    let conn = session
        .connect(bed.addr(), bed.cap("acme", Rights::READ_WRITE))
        .unwrap();
    let first_qp = conn.qp_num().unwrap();
    // A request naming a key that is no window of ours: the server's WRITE is refused by our
    // NIC checks and our QP dies.
    let bogus = Forgery {
        request_id: None,
        lease: Some(LeaseClaim {
            rkey: 0xffff_ff00,
            addr: 0,
            len: 16,
            right: LeaseRight::RemoteWrite,
        }),
        tag: None,
    };
    let data = vec![7u8; 16];
    conn.call(&KvStore::put("k"), Bulk::ToServer(&data))
        .unwrap();
    let err = conn
        .call_forged(
            &KvStore::get("k"),
            Bulk::None,
            bogus,
            Duration::from_secs(10),
        )
        .unwrap_err();
    assert!(matches!(err, SessionError::AccessError { .. }), "{err}");
    assert!(!conn.is_connected());
    let mut back = vec![0; 16];
    let r = conn
        .call(&KvStore::get("k"), Bulk::FromServer(&mut back))
        .unwrap();
    assert_eq!((r.bulk_len, back), (16, data));
    assert_ne!(conn.qp_num(), Some(first_qp));
    let stats = session.stats();
    assert_eq!((stats.access_errors, stats.reconnects), (1, 1));
    assert_eq!(bed.server.server().stats().access_errors, 1);
}

#[test]
fn server_shutdown_fails_calls_cleanly() {
    let bed = Bed::new(ServerConfig::default());
    let session = bed.session(SessionConfig {
        connect_timeout: Duration::from_millis(500),
        ..small()
    });
    let conn = session
        .connect(bed.addr(), bed.cap("acme", Rights::READ_WRITE))
        .unwrap();
    conn.call(&KvStore::get("k"), Bulk::None).unwrap();
    let Bed { server, .. } = bed;
    server.shutdown().unwrap();
    // The QP is gone (the call fails) or found dead first (the reconnect is refused).
    for _ in 0..2 {
        let err = conn.call(&KvStore::get("k"), Bulk::None).unwrap_err();
        assert!(
            err.is_connection_failure() || matches!(err, SessionError::Io { .. }),
            "{err}"
        );
    }
    assert!(!conn.is_connected());
}

#[test]
fn workers_waiting_for_bounce_buffers_keep_polling() {
    // One bounce buffer for two workers: it comes back only when a reply's completion is
    // polled, so a worker waiting for it must poll (blocking would starve every worker).
    let bed = Bed::new(ServerConfig {
        workers: 2,
        bounce_buffers: 1,
        ..ServerConfig::default()
    });
    let session = bed.session(small());
    let conn = session
        .connect(bed.addr(), bed.cap("acme", Rights::READ_WRITE))
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let conn = conn.clone();
            s.spawn(move || {
                let key = format!("k{t}");
                let mut back = vec![0; 64 << 10];
                for round in 0..25u8 {
                    let data = pattern(t ^ round, 4096 << (round % 5));
                    conn.call_timeout(
                        &KvStore::put(&key),
                        Bulk::ToServer(&data),
                        Duration::from_secs(20),
                    )
                    .unwrap();
                    let r = conn
                        .call_timeout(
                            &KvStore::get(&key),
                            Bulk::FromServer(&mut back),
                            Duration::from_secs(20),
                        )
                        .unwrap();
                    assert_eq!(&back[..r.bulk_len], &data[..]);
                }
            });
        }
    });
}

/// Whether the server closed `stream` (end of file or a reset), after its challenge, before
/// the client gave up waiting (`patience`): what a server that holds a stalled handshake
/// forever fails.
fn closed_by_server(stream: &mut TcpStream, patience: Duration) -> bool {
    stream.set_read_timeout(Some(patience)).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// A hello's start: magic, version, depth, max bulk, then the capability's length.
fn hello_claiming(capability_len: u32) -> Vec<u8> {
    let mut out = b"DPSS".to_vec();
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out.extend_from_slice(&8u16.to_le_bytes());
    out.extend_from_slice(&(1u32 << 20).to_le_bytes());
    out.extend_from_slice(&capability_len.to_le_bytes());
    out
}

#[test]
fn stalled_handshakes_are_bounded_and_a_hello_claiming_gigabytes_is_closed_at_once() {
    // Long enough that "closed" below can only mean "closed at once".
    let bed = Bed::new(ServerConfig {
        handshake_timeout: Duration::from_secs(60),
        ..ServerConfig::default()
    });
    let mut giant = TcpStream::connect(bed.addr()).unwrap();
    giant.write_all(&hello_claiming(u32::MAX)).unwrap();
    assert!(closed_by_server(&mut giant, Duration::from_secs(20)));

    // Clients that connect and send nothing, or half a hello, each hold a handshake.
    let stalled: Vec<TcpStream> = (0..MAX_HANDSHAKES)
        .map(|i| {
            let mut s = TcpStream::connect(bed.addr()).unwrap();
            if i % 2 == 1 {
                s.write_all(&hello_claiming(100)[..9]).unwrap();
            }
            s
        })
        .collect();
    let session = bed.session(small());
    match session.connect(bed.addr(), bed.cap("acme", Rights::READ_WRITE)) {
        Err(SessionError::Refused { reason, .. }) => {
            assert!(reason.contains("too many handshakes"), "{reason}")
        }
        other => panic!("expected a refusal beyond {MAX_HANDSHAKES} handshakes: {other:?}"),
    }
    // Once they go, a real client gets in again.
    drop(stalled);
    let conn = (0..100)
        .find_map(|_| {
            let got = session.connect(bed.addr(), bed.cap("acme", Rights::READ_WRITE));
            got.map_err(|_| std::thread::sleep(Duration::from_millis(50)))
                .ok()
        })
        .expect("a connection once the stalled handshakes are gone");
    conn.call(&KvStore::put("k"), Bulk::ToServer(b"v")).unwrap();
}

#[test]
fn a_client_that_never_finishes_its_hello_is_closed_at_the_handshake_timeout() {
    let bed = Bed::new(ServerConfig {
        handshake_timeout: Duration::from_secs(1),
        ..ServerConfig::default()
    });
    let mut silent = TcpStream::connect(bed.addr()).unwrap();
    let mut half = TcpStream::connect(bed.addr()).unwrap();
    half.write_all(&hello_claiming(100)[..9]).unwrap();
    // Well past the timeout, well short of forever.
    assert!(closed_by_server(&mut silent, Duration::from_secs(30)));
    assert!(closed_by_server(&mut half, Duration::from_secs(30)));
}
