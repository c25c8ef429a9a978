//! Chaos across nodes (docs/reliability.md, "Failing processes and machines"): an engine alone
//! on a storage network and two client nodes, each a network namespace with its own mount
//! keeper, node plugin, workers and software fabric device. Both nodes mount one multi-writer
//! volume and write to it the whole time, as applications would: small files, each fsync'd,
//! and fio writing and verifying. Then, one at a time: `kill -9` of a worker, the keeper, the
//! node plugin and the engine; node 0's link cut for 1 s and for 30 s; node 0 losing 10 % of
//! its packets, and its packets delayed 50 ms each way; the pool filled.
//!
//! After each fault the test waits until both nodes write again (a mount that stays dead fails
//! it) and checks, through the *other* node's mount, every file either node acknowledged
//! since the start and fio's last verified file: nothing acknowledged may be lost, and no block
//! may read back wrong. What the applications saw (errors by errno, the longest operation) is
//! printed as the table of docs/reliability.md.
//!
//! Needs root, /dev/fuse, fio, iproute2 and iptables; without them it says SKIPPED (a failure with
//! `DPUFS_REQUIRE_HOST=1`).

mod chaos_support;

use chaos_support::Cluster;
use chaos_support::load::{FioLoop, Seen, Writer, check, fio_job, run_fio};
use dpufs_e2e::csi_bed::MIB;
use dpufs_proto::csi::v1 as csi;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The pool: small enough to fill in seconds.
const POOL_BYTES: u64 = 1 << 30;
/// How long load runs before a fault.
const BEFORE: Duration = Duration::from_secs(2);
/// How long a node may take to write again once a fault has cleared before its mount counts
/// as dead.
const RECOVERY: Duration = Duration::from_secs(120);

/// One fault of the run.
#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    KillWorker(usize),
    KillKeeper(usize),
    KillNodePlugin(usize),
    KillEngine,
    CutLink(usize, Duration),
    /// Node `n` loses a share (%) of its packets each way for a while.
    LosePackets(usize, u32, Duration),
    /// Node `n`'s packets are delayed each way by the first duration for the second.
    DelayLink(usize, Duration, Duration),
    FillPool,
}

impl Fault {
    fn describe(self) -> String {
        match self {
            Fault::None => "none (baseline)".into(),
            Fault::KillWorker(n) => format!("kill -9 of node {n}'s worker"),
            Fault::KillKeeper(n) => format!("kill -9 of node {n}'s mount keeper, a new one"),
            Fault::KillNodePlugin(n) => format!("kill -9 of node {n}'s node plugin, a new one"),
            Fault::KillEngine => "kill -9 of the engine, restarted".into(),
            Fault::CutLink(n, d) => format!("node {n}'s link cut for {} s", d.as_secs()),
            Fault::LosePackets(n, p, d) => {
                format!("node {n} loses {p} % of its packets for {} s", d.as_secs())
            }
            Fault::DelayLink(n, delay, held) => format!(
                "node {n}'s packets delayed {} ms each way for {} s",
                delay.as_millis(),
                held.as_secs()
            ),
            Fault::FillPool => "the pool filled from node 1, then emptied".into(),
        }
    }
}

/// One node's share of the load, and where it mounts the shared volume.
struct Node {
    mount: PathBuf,
    writer: Writer,
    fio: FioLoop,
}

/// What one case showed on one node.
struct Row {
    seen: Seen,
    recovered: Duration,
    checked: u64,
    lost: u64,
}

#[tokio::test(flavor = "multi_thread")]
async fn faults_across_nodes_lose_no_acknowledged_byte_and_leave_no_dead_mount() {
    if !host_ready() {
        return;
    }
    let binary = dpufs_e2e::binary("dpufs-csi", "dpufs-csi");
    let mut cluster = Cluster::start(binary, 2, POOL_BYTES).await;
    let shared = cluster.nodes[0]
        .create_sized("shared", "ns-a", 512 * MIB)
        .await;
    let filler = cluster.nodes[0]
        .create_sized("filler", "ns-a", 960 * MIB)
        .await;
    let mut nodes = Vec::new();
    for (i, plugins) in cluster.nodes.iter().enumerate() {
        let (_, target) = plugins.mount(&shared.volume_id, "shared").await;
        nodes.push(Arc::new(Node {
            writer: Writer::new(i, target.join(format!("ledger-{i}"))),
            fio: FioLoop::new(target.join(format!("fio-{i}"))),
            mount: target,
        }));
    }
    let (_, filler_mount) = cluster.nodes[1].mount(&filler.volume_id, "filler").await;

    let faults = [
        Fault::None,
        Fault::KillWorker(0),
        Fault::KillKeeper(0),
        Fault::KillNodePlugin(1),
        Fault::KillEngine,
        Fault::CutLink(0, Duration::from_secs(1)),
        Fault::CutLink(0, Duration::from_secs(30)),
        Fault::LosePackets(0, 10, Duration::from_secs(10)),
        Fault::DelayLink(0, Duration::from_millis(50), Duration::from_secs(10)),
        Fault::FillPool,
    ];
    let mut table = Vec::new();
    let mut summary = String::from(
        "| fault | node | files acknowledged | errors the application saw | file p99 | longest file | writing again after | bytes checked (all files so far) | bytes lost |\n|---|---|---:|---|---:|---:|---:|---:|---:|\n",
    );
    let volumes = (shared.volume_id.as_str(), filler_mount.as_path());
    for fault in faults {
        let rows = run_case(&mut cluster, &nodes, volumes, fault).await;
        let lines = table_rows(fault, &rows);
        // As each case ends: the whole run takes minutes.
        eprint!("chaos:\n{lines}");
        summary += &lines;
        table.push((fault, rows));
    }
    eprintln!("\n{summary}");
    let lost: u64 = table.iter().flat_map(|(_, r)| r).map(|r| r.lost).sum();
    assert_eq!(lost, 0, "acknowledged bytes lost:\n{summary}");
    for (fault, rows) in &table {
        for (i, r) in rows.iter().enumerate() {
            assert!(
                !sees_no_error(*fault, i) || r.seen.errors.is_empty(),
                "node {i} saw errors with {}:\n{summary}",
                fault.describe()
            );
            assert_fault_was_felt(*fault, i, r, &summary);
        }
    }
}

/// That the fault happened: a cut link stalls its node for about as long as the cut (a file
/// in flight waits it out), a delayed link makes its node's files take round trips of the
/// delay, and a full pool fails the shared volume's writes on every node (the filler's own
/// quota was not what stopped it).
fn assert_fault_was_felt(fault: Fault, node: usize, r: &Row, summary: &str) {
    match fault {
        Fault::CutLink(n, held) if n == node => assert!(
            r.seen.longest() >= held.mul_f64(0.8),
            "node {n}'s longest file took {:?} with its link cut for {held:?}:\n{summary}",
            r.seen.longest()
        ),
        // A file is at least a create, a write and an fsync: three round trips.
        Fault::DelayLink(n, delay, _) if n == node => assert!(
            r.seen.longest() >= delay * 2 * 3,
            "node {n}'s longest file took {:?} with its packets delayed {delay:?} each way:\n{summary}",
            r.seen.longest()
        ),
        Fault::FillPool => assert!(
            r.seen.errors.contains_key("ENOSPC"),
            "node {node} saw no ENOSPC with the pool full:\n{summary}"
        ),
        _ => {}
    }
}

/// Whether node `node`'s applications must see no error at all with `fault` (the promises of
/// docs/reliability.md): a fault elsewhere, a restarted keeper or node plugin, lost packets,
/// a cut shorter than the fabric's call timeout. Where errors are allowed, they are what the
/// table reports: the requests a killed worker held fail with ECONNABORTED, the calls in flight
/// when the engine died with EIO, those of a cut as long as the call timeout with ETIMEDOUT,
/// writes into a full pool with ENOSPC.
fn sees_no_error(fault: Fault, node: usize) -> bool {
    let call_timeout = dpufs_fabric::session::SessionConfig::default().call_timeout;
    match fault {
        Fault::None | Fault::KillKeeper(_) | Fault::KillNodePlugin(_) => true,
        Fault::LosePackets(..) | Fault::DelayLink(..) => true,
        Fault::KillWorker(n) => node != n,
        Fault::CutLink(n, held) => node != n || held < call_timeout,
        Fault::KillEngine | Fault::FillPool => false,
    }
}

fn errors(seen: &Seen) -> String {
    if seen.errors.is_empty() {
        return "none".into();
    }
    let all: Vec<String> = seen
        .errors
        .iter()
        .map(|(e, n)| format!("{n}× {e}"))
        .collect();
    all.join(", ")
}

/// The rows of `fault`'s case in the summary table, one per node.
fn table_rows(fault: Fault, rows: &[Row]) -> String {
    let mut lines = String::new();
    for (i, r) in rows.iter().enumerate() {
        lines += &format!(
            "| {} | {i} | {} | {} | {} ms | {} ms | {:.2} s | {} | {} |\n",
            fault.describe(),
            r.seen.acked,
            errors(&r.seen),
            r.seen.p99().as_millis(),
            r.seen.longest().as_millis(),
            r.recovered.as_secs_f64(),
            r.checked,
            r.lost
        );
    }
    lines
}

/// Runs the load on every node, `fault` after [`BEFORE`], until every node has written again
/// after it cleared; then checks every file any node acknowledged since the start, from the
/// other node.
async fn run_case(
    cluster: &mut Cluster,
    nodes: &[Arc<Node>],
    (shared, filler): (&str, &Path),
    fault: Fault,
) -> Vec<Row> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for node in nodes {
        for fio in [false, true] {
            let (node, stop) = (node.clone(), stop.clone());
            threads.push(std::thread::spawn(move || match fio {
                false => node.writer.run(&stop),
                true => node.fio.run(&stop),
            }));
        }
    }
    tokio::time::sleep(BEFORE).await;
    inject(cluster, shared, filler, fault).await;
    let cleared = Instant::now();
    let mut recovered = vec![None; nodes.len()];
    while recovered.iter().any(Option::is_none) {
        for (i, node) in nodes.iter().enumerate() {
            let (acked, first) = node.writer.acked_after(cleared);
            if recovered[i].is_none() && acked >= 3 && node.fio.passed_after(cleared) {
                recovered[i] = first.map(|t| t - cleared);
            }
        }
        // A load thread ends only when told to: one that ended panicked.
        assert!(
            !threads.iter().any(|t| t.is_finished()),
            "{}: a load thread died",
            fault.describe()
        );
        if cleared.elapsed() > RECOVERY {
            stop.store(true, Ordering::Release);
            panic!(
                "{}: a node still does not write {RECOVERY:?} after the fault cleared ({recovered:?}): a dead mount",
                fault.describe()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Release);
    for t in threads {
        t.join().expect("a load thread");
    }
    let mut rows = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let other = &nodes[(i + 1) % nodes.len()];
        let (mut seen, acked) = node.writer.take();
        let (fio_seen, corrupt, last_passed) = node.fio.take();
        assert!(
            corrupt.is_empty(),
            "{}: node {i}'s fio read wrong blocks in {corrupt:?}",
            fault.describe()
        );
        for (e, n) in fio_seen.errors {
            *seen.errors.entry(e).or_default() += n;
        }
        let ledger_there = other.mount.join(format!("ledger-{i}"));
        let (checked, lost, first) = check(i, &ledger_there, &acked);
        if let Some(first) = first {
            eprintln!(
                "{}: node {i}'s acknowledged file lost: {first}",
                fault.describe()
            );
        }
        if let Some(file) = last_passed {
            let there = other.mount.join(format!("fio-{i}")).join(file);
            let (result, corrupt) = run_fio(fio_job(&there, true));
            assert!(
                result.is_ok() && !corrupt,
                "{}: node {i}'s last verified fio file, read from the other node: {result:?}",
                fault.describe()
            );
        }
        rows.push(Row {
            seen,
            recovered: recovered[i].expect("recovered"),
            checked,
            lost,
        });
    }
    rows
}

/// Injects `fault` and returns once it has cleared.
async fn inject(cluster: &mut Cluster, shared: &str, filler: &Path, fault: Fault) {
    match fault {
        Fault::None => {}
        Fault::KillWorker(n) => {
            let (_, pid) = cluster.nodes[n].keeper_volumes()[0].clone();
            dpufs_e2e::kill9(pid.expect("a worker"));
        }
        Fault::KillKeeper(n) => {
            let node = &mut cluster.nodes[n];
            let (volume, worker) = node.keeper_volumes()[0].clone();
            node.kill9_and_restart_keeper();
            // The new keeper found the volume's worker alive and left it serving (it does not
            // adopt it: docs/keeper.md, "Records and clean-up").
            let recovered = node.keeper_recovered();
            assert!(
                recovered
                    .iter()
                    .any(|r| r.volume.as_ref() == Some(&volume) && r.pid == worker),
                "the new keeper's recovery: {recovered:?}"
            );
        }
        Fault::KillNodePlugin(n) => {
            cluster.nodes[n].kill9_and_restart_node_plugin().await;
            // The new plugin serves the volume it finds staged.
            let target = cluster.nodes[n].path("shared/mount");
            let stats = cluster.nodes[n]
                .node
                .clone()
                .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                    volume_id: shared.into(),
                    volume_path: target.display().to_string(),
                    ..Default::default()
                })
                .await;
            assert!(
                stats.is_ok(),
                "NodeGetVolumeStats after the restart: {stats:?}"
            );
        }
        Fault::KillEngine => cluster
            .vol
            .engine
            .crash_and_restart()
            .expect("engine restart"),
        Fault::CutLink(n, held) => {
            cluster.net.cut(n);
            tokio::time::sleep(held).await;
            cluster.net.restore(n);
        }
        Fault::LosePackets(n, percent, held) => {
            cluster.net.lose(n, percent);
            tokio::time::sleep(held).await;
            let dropped = cluster.net.stop_losing(n);
            assert!(dropped > 0, "node {n} lost no packet");
        }
        Fault::DelayLink(n, delay, held) => {
            let line = cluster.net.delay(n, delay);
            tokio::time::sleep(held).await;
            let delayed = cluster.net.stop_delaying(n, line);
            assert!(delayed > 0, "node {n}'s line delayed no packet");
        }
        Fault::FillPool => {
            let dir = filler.to_path_buf();
            let (bytes, why) = tokio::task::spawn_blocking(move || fill(&dir))
                .await
                .expect("fill");
            eprintln!("chaos: the pool took {} MiB more, then {why}", bytes >> 20);
            assert_eq!(why, "ENOSPC", "the filler stopped for another reason");
            tokio::time::sleep(BEFORE).await;
            for f in std::fs::read_dir(filler).expect("the filler's files") {
                std::fs::remove_file(f.expect("an entry").path()).expect("remove a filler file");
            }
        }
    }
}

/// Writes 1 MiB blocks into files under `dir` until a write fails; the bytes written and the
/// error. Direct, so each write is answered by the engine (FUSE takes unaligned buffers).
fn fill(dir: &Path) -> (u64, String) {
    let block = vec![0x5a_u8; 1 << 20];
    let mut written = 0;
    for n in 0.. {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.join(format!("fill-{n}")))
            .expect("a filler file");
        for _ in 0..64 {
            if let Err(e) = f.write_all(&block) {
                return (written, chaos_support::load::errno_name(&e));
            }
            written += block.len() as u64;
        }
    }
    unreachable!("the loop ends at the first failed write")
}

fn host_ready() -> bool {
    use dpufs_e2e::skip::host_has;
    // SAFETY: plain getter.
    let root = unsafe { libc::geteuid() } == 0;
    let found = |tool: &str, arg: &str| Command::new(tool).arg(arg).output().is_ok();
    host_has(
        root && Path::new("/dev/fuse").exists(),
        "needs root and /dev/fuse",
    ) && host_has(
        found("fio", "--version"),
        "fio is not installed (apt-get install fio)",
    ) && host_has(
        found("ip", "-V"),
        "ip is not installed (apt-get install iproute2)",
    ) && host_has(
        found("iptables", "-V"),
        "iptables is not installed (apt-get install iptables)",
    )
}
