//! Software provider vs plain TCP between the same two processes, side by side in one run
//! (docs/benchmarks.md: ratios measured side by side in one run): 1 MiB RDMA WRITE and READ throughput against a TCP
//! stream, and 4 KiB round trips (RDMA READ, RDMA WRITE until its ACK) against a TCP
//! request/response loop, with the CPU time of both processes per GiB moved.
//!
//! `cargo bench -p dpufs-fabric --bench rma` prints criterion's numbers for each workload, then
//! a Markdown table of ratios (the table in docs/benchmarks.md comes from here). The table comes
//! from paired rounds: each round measures the RDMA workload and its TCP yardstick back to back,
//! and the table reports medians over the rounds, so load that drifts during the run (other
//! processes on a shared 2-core machine) hits both sides of a ratio alike.

use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use dpufs_fabric::conformance::{Env, Link, Peer, PeerMr, baseline, cpu_time_us};
use dpufs_fabric::soft::{DeviceOptions, RESPONDER_POLL_ENV, SoftDevice, SoftMr};
use dpufs_fabric::{
    Access, CompletionQueue, QueuePair, RdmaDevice, RemoteAddr, SendOp, SendWr, Sge, WcStatus,
};

const MIB: usize = 1 << 20;
const SMALL: usize = 4096;
/// Outstanding 1 MiB requests (and buffer slots on each side).
const WINDOW: usize = 4;
const WAIT: Duration = Duration::from_secs(30);

/// Paired rounds for the table, and the time each side of a round runs.
const ROUNDS: usize = 15;
const ROUND_TIME: Duration = Duration::from_millis(200);

/// One measurement: time per operation and CPU time of both processes.
#[derive(Clone, Copy, Debug)]
struct Sample {
    secs_per_op: f64,
    cpu_secs_per_op: f64,
}

struct Bench {
    _dir: tempfile::TempDir,
    /// Node 1 here, the engine on node 2 in the peer process.
    env: Env<SoftDevice>,
    link: Link<SoftDevice>,
    local: SoftMr,
    remote: PeerMr,
    /// Baseline connections: a stream, and ping-pongs in each direction of a 4 KiB transfer.
    tcp_stream: baseline::Client,
    tcp_read_rr: baseline::Client,
    tcp_write_rr: baseline::Client,
}

impl Bench {
    /// A peer whose responders poll for `responder_poll_us` before they sleep.
    fn new(responder_poll_us: u64) -> Bench {
        let dir = tempfile::Builder::new()
            .prefix("dpufs-fabric-bench")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("device dir");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric-peer"));
        cmd.arg(dir.path())
            .env(RESPONDER_POLL_ENV, responder_poll_us.to_string());
        let peer = Peer::spawn(cmd).expect("spawn peer");
        let dev = SoftDevice::open(&DeviceOptions::new("node1").in_dir(dir.path())).expect("open");
        let env = Env::new(dev, "node1", peer, "node2").expect("engine in the peer");
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let remote = env
            .peer
            .reg_mr(env.engine.dev, env.engine.pd, WINDOW * MIB, rw, 0x5a)
            .expect("peer mr");
        let pd = env.dev.alloc_pd().expect("pd");
        let local = env.mr(&pd, WINDOW * MIB, rw).expect("mr");
        let link = env.link(&pd, Access::NONE).expect("link");
        let addr = env.peer.tcp_serve().expect("tcp server");
        let connect = || baseline::Client::connect(&addr).expect("tcp");
        let (tcp_stream, mut tcp_read_rr, mut tcp_write_rr) = (connect(), connect(), connect());
        tcp_read_rr.start_ping_pong(24, SMALL).expect("ping-pong");
        tcp_write_rr.start_ping_pong(SMALL, 24).expect("ping-pong");
        Bench {
            _dir: dir,
            env,
            link,
            local,
            remote,
            tcp_stream,
            tcp_read_rr,
            tcp_write_rr,
        }
    }

    /// CPU time of both processes so far, in seconds.
    fn cpu(&self) -> f64 {
        let (u, s) = cpu_time_us();
        let (pu, ps) = self.env.peer.usage().expect("peer usage");
        (u + s + pu + ps) as f64 / 1e6
    }

    /// Runs `workload` in batches of `batch` operations for at least `time`.
    fn sample(&mut self, workload: Workload, batch: u64, time: Duration) -> Sample {
        let cpu = self.cpu();
        let start = Instant::now();
        let mut ops = 0;
        while start.elapsed() < time {
            self.run(workload, batch);
            ops += batch;
        }
        let elapsed = start.elapsed().as_secs_f64();
        Sample {
            secs_per_op: elapsed / ops as f64,
            cpu_secs_per_op: (self.cpu() - cpu) / ops as f64,
        }
    }

    /// `n` operations of `workload`.
    fn run(&mut self, workload: Workload, n: u64) {
        match workload {
            Workload::RdmaWrite1M => self.rdma(true, MIB, n, WINDOW),
            Workload::RdmaRead1M => self.rdma(false, MIB, n, WINDOW),
            Workload::TcpSend1M => self.tcp_stream.sink(n * MIB as u64).expect("tcp sink"),
            Workload::TcpRecv1M => self.tcp_stream.source(n * MIB as u64).expect("tcp source"),
            Workload::RdmaRead4K => self.rdma(false, SMALL, n, 1),
            Workload::RdmaWrite4K => self.rdma(true, SMALL, n, 1),
            Workload::TcpReadRr4K => {
                (0..n).for_each(|_| self.tcp_read_rr.ping(24, SMALL).expect("ping"))
            }
            Workload::TcpWriteRr4K => {
                (0..n).for_each(|_| self.tcp_write_rr.ping(SMALL, 24).expect("ping"))
            }
        }
    }

    /// Keeps up to `window` RDMA operations of `len` bytes in flight until `n` completed.
    fn rdma(&self, write: bool, len: usize, n: u64, window: usize) {
        let (mut posted, mut done) = (0u64, 0u64);
        while done < n {
            while posted < n && posted - done < window as u64 {
                let slot = (posted as usize % window) * len;
                let sge = Sge {
                    mr: &self.local,
                    offset: slot,
                    len,
                };
                let remote = RemoteAddr {
                    addr: self.remote.addr + slot as u64,
                    rkey: self.remote.rkey,
                };
                self.link
                    .qp
                    .post_send(SendWr {
                        wr_id: posted,
                        op: SendOp::rdma(write, sge, remote),
                        signaled: true,
                    })
                    .expect("post");
                posted += 1;
            }
            let wc = self.link.send_cq.wait(WAIT).expect("completion");
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            done += 1;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    RdmaWrite1M,
    TcpSend1M,
    RdmaRead1M,
    TcpRecv1M,
    RdmaRead4K,
    TcpReadRr4K,
    RdmaWrite4K,
    TcpWriteRr4K,
}

impl Workload {
    const ALL: [Workload; 8] = [
        Workload::RdmaWrite1M,
        Workload::TcpSend1M,
        Workload::RdmaRead1M,
        Workload::TcpRecv1M,
        Workload::RdmaRead4K,
        Workload::TcpReadRr4K,
        Workload::RdmaWrite4K,
        Workload::TcpWriteRr4K,
    ];

    fn name(self) -> &'static str {
        match self {
            Workload::RdmaWrite1M => "rdma_write_1MiB",
            Workload::TcpSend1M => "tcp_stream_send_1MiB",
            Workload::RdmaRead1M => "rdma_read_1MiB",
            Workload::TcpRecv1M => "tcp_stream_recv_1MiB",
            Workload::RdmaRead4K => "rdma_read_4KiB_round_trip",
            Workload::TcpReadRr4K => "tcp_rr_24B_to_4KiB",
            Workload::RdmaWrite4K => "rdma_write_4KiB_round_trip",
            Workload::TcpWriteRr4K => "tcp_rr_4KiB_to_24B",
        }
    }

    fn bytes(self) -> usize {
        match self {
            Workload::RdmaWrite1M
            | Workload::TcpSend1M
            | Workload::RdmaRead1M
            | Workload::TcpRecv1M => MIB,
            _ => SMALL,
        }
    }

    /// Operations per batch: a few 1 MiB transfers, or a run of round trips.
    fn batch(self) -> u64 {
        if self.bytes() == MIB { 8 } else { 64 }
    }
}

fn criterion_benches(c: &mut Criterion, b: &mut Bench) {
    let mut group = c.benchmark_group("fabric");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for workload in Workload::ALL {
        group.throughput(Throughput::Bytes(workload.bytes() as u64));
        group.bench_function(workload.name(), |it| {
            it.iter_custom(|n| {
                let start = Instant::now();
                b.run(workload, n);
                start.elapsed()
            })
        });
    }
    group.finish();
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// One row of the table: an RDMA workload against its TCP yardstick.
struct Row {
    what: &'static str,
    rdma: Workload,
    tcp: Workload,
    target: f64,
}

const ROWS: [Row; 4] = [
    Row {
        what: "1 MiB RDMA WRITE vs TCP stream",
        rdma: Workload::RdmaWrite1M,
        tcp: Workload::TcpSend1M,
        target: 0.8,
    },
    Row {
        what: "1 MiB RDMA READ vs TCP stream (other way)",
        rdma: Workload::RdmaRead1M,
        tcp: Workload::TcpRecv1M,
        target: 0.8,
    },
    Row {
        what: "4 KiB RDMA READ round trip vs TCP 24 B → 4 KiB",
        rdma: Workload::RdmaRead4K,
        tcp: Workload::TcpReadRr4K,
        target: 0.7,
    },
    Row {
        what: "4 KiB RDMA WRITE round trip vs TCP 4 KiB → 24 B",
        rdma: Workload::RdmaWrite4K,
        tcp: Workload::TcpWriteRr4K,
        target: 0.7,
    },
];

/// Paired rounds of one row, as a table line; `mode` names the responder mode.
fn table_row(b: &mut Bench, row: &Row, mode: &str) -> String {
    let Row {
        what,
        rdma,
        tcp,
        target,
    } = *row;
    let gib = (1u64 << 30) as f64;
    let rounds: Vec<(Sample, Sample)> = (0..ROUNDS)
        .map(|_| {
            (
                b.sample(rdma, rdma.batch(), ROUND_TIME),
                b.sample(tcp, tcp.batch(), ROUND_TIME),
            )
        })
        .collect();
    let bytes = rdma.bytes() as f64;
    let ratio = median(
        rounds
            .iter()
            .map(|(r, t)| t.secs_per_op / r.secs_per_op)
            .collect(),
    );
    let per_op = |pick: fn(&(Sample, Sample)) -> Sample| {
        let s: Vec<Sample> = rounds.iter().map(pick).collect();
        (
            median(s.iter().map(|x| x.secs_per_op).collect()),
            median(s.iter().map(|x| x.cpu_secs_per_op * gib / bytes).collect()),
        )
    };
    let ((r_op, r_cpu), (t_op, t_cpu)) = (per_op(|p| p.0), per_op(|p| p.1));
    let shown = |secs: f64| {
        let mib_s = bytes / secs / MIB as f64;
        if rdma.bytes() == MIB {
            format!("{mib_s:.0} MiB/s")
        } else {
            format!("{:.1} µs ({mib_s:.0} MiB/s)", secs * 1e6)
        }
    };
    format!(
        "| {what} | {mode} | {} | {} | {ratio:.2} | {r_cpu:.2} | {t_cpu:.2} | ≥ {target} |\n",
        shown(r_op),
        shown(t_op),
    )
}

/// Paired rounds, then the table: every row with sleeping responders (the default), and the
/// 4 KiB round trips again with responders that poll for [`POLL_US`].
fn table(sleeping: &mut Bench, polling: &mut Bench) -> String {
    let mut out = String::from(
        "| workload | responder | software RDMA | plain TCP | ratio (median of rounds) | CPU s/GiB RDMA | CPU s/GiB TCP | target |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for row in &ROWS {
        out += &table_row(sleeping, row, "sleeps");
    }
    let polls = format!("polls {POLL_US} µs");
    for row in ROWS.iter().filter(|r| r.rdma.bytes() == SMALL) {
        out += &table_row(polling, row, &polls);
    }
    out
}

/// Responder polling of the second peer, in µs.
const POLL_US: u64 = 50;

fn main() {
    let mut b = Bench::new(0);
    let mut c = Criterion::default().configure_from_args();
    criterion_benches(&mut c, &mut b);
    c.final_summary();
    println!(
        "\nPaired rounds: {ROUNDS} × ({} ms RDMA + {} ms TCP) per row. Ratio = TCP time / RDMA time per operation.\n",
        ROUND_TIME.as_millis(),
        ROUND_TIME.as_millis()
    );
    let mut polling = Bench::new(POLL_US);
    println!("{}", table(&mut b, &mut polling));
}
