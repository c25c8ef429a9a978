//! Tenant-session calls over the software provider, between this process (the worker) and a
//! `session-peer serve` process (the engine, with the test key-value handler): 1 MiB reads and
//! writes, 4 KiB reads and writes from one thread, and 4 KiB reads from four threads sharing one
//! connection. Each workload runs with both invalidation modes (the server's SEND_WITH_INV with
//! the reply, or the worker's LOCAL_INV after it), side by side in one run.
//!
//! `cargo bench -p dpufs-fabric --bench session` prints criterion's numbers, then a Markdown
//! table from paired rounds (each round measures both modes back to back, alternating which goes
//! first; medians over rounds).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use dpufs_fabric::session::testing::KvStore;
use dpufs_fabric::session::{
    AgentKey, Bulk, Capability, Connection, Invalidation, Rights, SessionConfig, TenantSession,
};
use dpufs_fabric::soft::{DeviceOptions, SoftDevice};

const MIB: usize = 1 << 20;
const SMALL: usize = 4096;
const THREADS: usize = 4;
const ROUNDS: usize = 11;
const ROUND_TIME: Duration = Duration::from_millis(200);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Read1M,
    Write1M,
    Read4K,
    Write4K,
    Read4KThreads,
}

impl Workload {
    const ALL: [Workload; 5] = [
        Workload::Read1M,
        Workload::Write1M,
        Workload::Read4K,
        Workload::Write4K,
        Workload::Read4KThreads,
    ];

    fn name(self) -> &'static str {
        match self {
            Workload::Read1M => "read_1MiB",
            Workload::Write1M => "write_1MiB",
            Workload::Read4K => "read_4KiB",
            Workload::Write4K => "write_4KiB",
            Workload::Read4KThreads => "read_4KiB_4_threads",
        }
    }

    fn bytes(self) -> usize {
        match self {
            Workload::Read1M | Workload::Write1M => MIB,
            _ => SMALL,
        }
    }
}

struct Side {
    _session: TenantSession<SoftDevice>,
    conn: Arc<Connection<SoftDevice>>,
}

impl Side {
    /// Runs `n` operations of `workload`.
    fn run(&self, workload: Workload, n: u64) {
        let key = if workload.bytes() == MIB {
            "big"
        } else {
            "small"
        };
        match workload {
            Workload::Read4KThreads => std::thread::scope(|s| {
                for t in 0..THREADS as u64 {
                    let share = n / THREADS as u64 + u64::from(t < n % THREADS as u64);
                    s.spawn(move || self.reads(key, SMALL, share));
                }
            }),
            Workload::Read1M | Workload::Read4K => self.reads(key, workload.bytes(), n),
            Workload::Write1M | Workload::Write4K => {
                let data = vec![0x5a; workload.bytes()];
                let request = KvStore::put(key);
                let mut reply = Vec::new();
                for _ in 0..n {
                    self.conn
                        .call_into(
                            &request,
                            Bulk::ToServer(&data),
                            &mut reply,
                            Duration::from_secs(30),
                        )
                        .expect("write");
                }
            }
        }
    }

    fn reads(&self, key: &str, len: usize, n: u64) {
        let mut buf = vec![0; len];
        let request = KvStore::get(key);
        let mut reply = Vec::new();
        for _ in 0..n {
            let got = self
                .conn
                .call_into(
                    &request,
                    Bulk::FromServer(&mut buf),
                    &mut reply,
                    Duration::from_secs(30),
                )
                .expect("read");
            assert_eq!(got, len);
        }
    }

    /// Seconds per operation over about `time`.
    fn sample(&self, workload: Workload, time: Duration) -> f64 {
        let batch = if workload.bytes() == MIB { 4 } else { 64 };
        let start = Instant::now();
        let mut ops = 0;
        while start.elapsed() < time {
            self.run(workload, batch);
            ops += batch;
        }
        start.elapsed().as_secs_f64() / ops as f64
    }
}

struct Bench {
    _dir: tempfile::TempDir,
    engine: Child,
    sides: Vec<(&'static str, Side)>,
}

impl Bench {
    fn new() -> Bench {
        let dir = tempfile::Builder::new()
            .prefix("dpufs-session-bench")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("device dir");
        let agent = AgentKey::generate().expect("agent key");
        let pem = dir.path().join("agent.pub");
        std::fs::write(&pem, agent.public_key().unwrap().to_pem().unwrap()).unwrap();
        let mut engine = Command::new(env!("CARGO_BIN_EXE_session-peer"))
            .args([
                "serve".as_ref(),
                dir.path().as_os_str(),
                "node2".as_ref(),
                pem.as_os_str(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn session-peer serve");
        let mut line = String::new();
        BufReader::new(engine.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("engine address");
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok())
            .expect("listening <addr>");
        let claims = Capability::new(
            "bench",
            "vol",
            "pool",
            "cont",
            Rights::READ_WRITE,
            Duration::from_secs(3600),
        );
        let cap = agent.sign(&claims).unwrap();
        let side = |invalidation| {
            let dev =
                SoftDevice::open(&DeviceOptions::new("node1").in_dir(dir.path())).expect("node1");
            let config = SessionConfig {
                read_slots: THREADS,
                write_slots: 2,
                depth: 8,
                max_connections: 1,
                invalidation,
                ..SessionConfig::default()
            };
            let session = TenantSession::open(dev, config).expect("session");
            let conn = session.connect(addr, cap.clone()).expect("connect");
            Side {
                _session: session,
                conn,
            }
        };
        let sides = vec![
            ("SEND_WITH_INV", side(Invalidation::WithReply)),
            ("LOCAL_INV", side(Invalidation::Local)),
        ];
        for (key, len) in [("big", MIB), ("small", SMALL)] {
            sides[0]
                .1
                .conn
                .call(&KvStore::put(key), Bulk::ToServer(&vec![1; len]))
                .expect("seed value");
        }
        Bench {
            _dir: dir,
            engine,
            sides,
        }
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        if let Some(stdin) = self.engine.stdin.as_mut() {
            let _ = writeln!(stdin, "stop");
        }
        let _ = self.engine.wait();
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let bench = Bench::new();
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("session");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for workload in Workload::ALL {
        group.throughput(Throughput::Bytes(workload.bytes() as u64));
        for (mode, side) in &bench.sides {
            group.bench_function(format!("{}/{mode}", workload.name()), |it| {
                it.iter_custom(|n| {
                    let start = Instant::now();
                    side.run(workload, n);
                    start.elapsed()
                })
            });
        }
    }
    group.finish();
    c.final_summary();
    println!(
        "\nPaired rounds: {ROUNDS} × {} ms per mode. Median time per call; ratio = LOCAL_INV / SEND_WITH_INV.\n",
        ROUND_TIME.as_millis()
    );
    println!("| workload | SEND_WITH_INV | LOCAL_INV | ratio |\n|---|---|---|---|");
    for workload in Workload::ALL {
        // Alternate which mode goes first, so neither always pays for the switch.
        let rounds: Vec<(f64, f64)> = (0..ROUNDS)
            .map(|round| {
                let (a, b) = (&bench.sides[0].1, &bench.sides[1].1);
                if round % 2 == 0 {
                    let first = a.sample(workload, ROUND_TIME);
                    (first, b.sample(workload, ROUND_TIME))
                } else {
                    let first = b.sample(workload, ROUND_TIME);
                    (a.sample(workload, ROUND_TIME), first)
                }
            })
            .collect();
        let with_reply = median(rounds.iter().map(|r| r.0).collect());
        let local = median(rounds.iter().map(|r| r.1).collect());
        let ratio = median(rounds.iter().map(|r| r.1 / r.0).collect());
        let shown = |secs: f64| {
            let mib_s = workload.bytes() as f64 / secs / MIB as f64;
            format!("{:.1} µs ({mib_s:.0} MiB/s)", secs * 1e6)
        };
        println!(
            "| {} | {} | {} | {ratio:.2} |",
            workload.name(),
            shown(with_reply),
            shown(local)
        );
    }
}
