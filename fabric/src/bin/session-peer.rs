//! A tenant worker process for the session tests: opens the node's software device (as every
//! worker on a node does), its own tenant session, connects to a session server with the
//! capability it is given, and moves data in a loop while the test attacks from elsewhere.
//!
//! Built only with the feature `testing` (`required-features`), as the tests and benchmarks do.
//!
//! Usage: `session-peer <device-dir> <device-name> <server-addr> <capability-hex> <seed>`, or
//! `session-peer serve <device-dir> <device-name> <agent-public-key.pem>` to run a session
//! server with the test key-value handler instead (benchmarks): it answers `listening <addr>`
//! and serves until stdin closes.
//!
//! Two threads each loop `put` then `get` of their own key (4 KiB, 256 KiB and 1 MiB values
//! made from `seed`) and check every byte that comes back. Lines on stdout: `ready` after the
//! first checked round trip, then answers to commands read from stdin:
//!
//! - `wait <n>`: answers `rounds <count>` once at least `n` rounds are done;
//! - `hold <key>`: stores a value under `key`, then calls the server's hold-then-get on it
//!   (the server keeps the lease bound until the test releases it); answers
//!   `held ok <bulk-len> <intact>` or `held err <error>` when the call returns;
//! - `stop`: stops the loops and answers `stats calls=<n> errors=<n> corrupt=<n>` (plus
//!   ` first_error=<e>` if any), then exits.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use dpufs_fabric::session::testing::KvStore;
use dpufs_fabric::session::{
    AgentPublicKey, Bulk, Connection, ServerConfig, SessionConfig, SessionServer, SignedCapability,
    TenantSession, TrustedAgents,
};
use dpufs_fabric::soft::{DeviceOptions, SoftDevice};

const THREADS: usize = 2;
const SIZES: [usize; 3] = [4096, 256 << 10, 1 << 20];

#[derive(Default)]
struct Tally {
    calls: AtomicU64,
    errors: AtomicU64,
    corrupt: AtomicU64,
    rounds: Mutex<u64>,
    progressed: Condvar,
    first_error: Mutex<Option<String>>,
}

impl Tally {
    fn error(&self, e: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.first_error
            .lock()
            .unwrap()
            .get_or_insert_with(|| e.to_string());
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn value(seed: u8, thread: usize, round: u64, len: usize) -> Vec<u8> {
    let base = seed
        .wrapping_mul(31)
        .wrapping_add(thread as u8)
        .wrapping_add(round as u8);
    (0..len)
        .map(|i| base.wrapping_add((i % 253) as u8) ^ seed)
        .collect()
}

/// One checked round trip; `Ok(false)` if the data came back wrong.
fn round_trip(
    conn: &Connection<SoftDevice>,
    key: &str,
    data: &[u8],
    back: &mut [u8],
) -> Result<bool, String> {
    let put = conn
        .call(&KvStore::put(key), Bulk::ToServer(data))
        .map_err(|e| e.to_string())?;
    if put.message != b"ok" {
        return Err(format!(
            "put answered {:?}",
            String::from_utf8_lossy(&put.message)
        ));
    }
    let got = conn
        .call(&KvStore::get(key), Bulk::FromServer(back))
        .map_err(|e| e.to_string())?;
    Ok(got.message == b"ok" && got.bulk_len == data.len() && back[..data.len()] == *data)
}

/// `serve` mode: a session server on `name` trusting the agent key in `pem`.
fn serve(dir: &str, name: &str, pem: &str) -> Result<(), String> {
    let pem = std::fs::read(pem).map_err(|e| format!("read {pem}: {e}"))?;
    let mut trusted = TrustedAgents::new();
    trusted.add(AgentPublicKey::from_pem(&pem).map_err(|e| e.to_string())?);
    let dev = SoftDevice::open(&DeviceOptions::new(name).in_dir(dir)).map_err(|e| e.to_string())?;
    let listen = "127.0.0.1:0".parse().expect("address");
    let server = SessionServer::bind(
        dev,
        listen,
        trusted,
        KvStore::new().handler(),
        ServerConfig::default(),
    )
    .and_then(SessionServer::spawn)
    .map_err(|e| e.to_string())?;
    say(&format!("listening {}", server.server().local_addr()));
    for line in std::io::stdin().lock().lines() {
        if line.map_err(|e| e.to_string())?.trim() == "stop" {
            break;
        }
    }
    server.shutdown().map_err(|e| e.to_string())
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, dir, name, pem] = args.as_slice()
        && mode == "serve"
    {
        return serve(dir, name, pem);
    }
    let [dir, name, addr, cap, seed] = args.as_slice() else {
        return Err(
            "usage: session-peer <device-dir> <device-name> <server-addr> <capability-hex> <seed>"
                .into(),
        );
    };
    let addr: SocketAddr = addr.parse().map_err(|e| format!("server address: {e}"))?;
    let cap = SignedCapability::from_hex(cap).map_err(|e| e.to_string())?;
    let seed: u8 = seed.parse().map_err(|e| format!("seed: {e}"))?;
    let dev = SoftDevice::open(&DeviceOptions::new(name.as_str()).in_dir(dir))
        .map_err(|e| e.to_string())?;
    let config = SessionConfig {
        read_slots: 4,
        write_slots: 4,
        depth: 8,
        max_connections: 2,
        ..SessionConfig::default()
    };
    let session = TenantSession::open(dev, config).map_err(|e| e.to_string())?;
    let conn = session.connect(addr, cap).map_err(|e| e.to_string())?;
    let mut back = vec![0; 1 << 20];
    if !round_trip(&conn, "probe", &value(seed, 9, 0, 4096), &mut back)? {
        return Err("first round trip came back wrong".into());
    }
    say("ready");
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let loops: Vec<_> = (0..THREADS)
        .map(|t| {
            let (conn, tally, stop) = (conn.clone(), tally.clone(), stop.clone());
            std::thread::spawn(move || {
                let key = format!("k{t}");
                let mut back = vec![0; 1 << 20];
                let mut round = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let data = value(seed, t, round, SIZES[round as usize % SIZES.len()]);
                    tally.calls.fetch_add(2, Ordering::Relaxed);
                    match round_trip(&conn, &key, &data, &mut back) {
                        Ok(true) => {}
                        Ok(false) => {
                            tally.corrupt.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => tally.error(e),
                    }
                    round += 1;
                    *tally.rounds.lock().unwrap() += 1;
                    tally.progressed.notify_all();
                }
            })
        })
        .collect();
    let mut holds = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("wait"), Some(n)) => {
                let n: u64 = n.parse().map_err(|e| format!("wait: {e}"))?;
                let mut rounds = tally.rounds.lock().unwrap();
                while *rounds < n {
                    rounds = tally.progressed.wait(rounds).unwrap();
                }
                say(&format!("rounds {}", *rounds));
            }
            (Some("hold"), Some(key)) => {
                let (conn, key) = (conn.clone(), key.to_owned());
                holds.push(std::thread::spawn(move || {
                    let data = value(seed, 7, 7, 64 << 10);
                    let mut back = vec![0; data.len()];
                    let put = conn.call(&KvStore::put(&key), Bulk::ToServer(&data));
                    let held = put
                        .and_then(|_| conn.call(&KvStore::hold(&key), Bulk::FromServer(&mut back)));
                    match held {
                        Ok(r) => say(&format!("held ok {} {}", r.bulk_len, back == data)),
                        Err(e) => say(&format!("held err {e}")),
                    }
                }));
            }
            (Some("stop"), _) => break,
            _ => return Err(format!("unknown command {line:?}")),
        }
    }
    stop.store(true, Ordering::Release);
    for t in loops.into_iter().chain(holds) {
        let _ = t.join();
    }
    let mut line = format!(
        "stats calls={} errors={} corrupt={}",
        tally.calls.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed),
        tally.corrupt.load(Ordering::Relaxed)
    );
    if let Some(e) = tally.first_error.lock().unwrap().as_ref() {
        line.push_str(&format!(" first_error={e}"));
    }
    say(&line);
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("session-peer: {e}");
            say(&format!("failed {e}"));
            ExitCode::FAILURE
        }
    }
}
