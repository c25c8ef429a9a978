//! `daos-bed VERSION DIR [WORKER]`: a one-node DAOS system from this machine's DAOS
//! `VERSION` prefix (as the e2e tests find it), a pool `tank` and a POSIX container `vol`,
//! mounted by DAOS's dfuse at `DIR/dfuse` and, given the `dpufs-csi` binary `WORKER`, by a
//! dpufs volume worker on libdfs at `DIR/dpufs`. It prints one `NAME=MOUNT` line per mount,
//! then serves until SIGINT or SIGTERM, and takes everything down.
//!
//! For side-by-side measurements of the two clients (docs/benchmarks.md, "Real DAOS").

use dpufs_e2e::daos_system::{self, DaosSystem, is_mount_point};
use dpufs_e2e::dfuse::Dfuse;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (version, dir, worker) = match args.as_slice() {
        [v, d] => (v, PathBuf::from(d), None),
        [v, d, w] => (v, PathBuf::from(d), Some(PathBuf::from(w))),
        _ => {
            eprintln!("usage: daos-bed VERSION DIR [DPUFS_CSI_BINARY]");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(version, &dir, worker.as_deref()) {
        eprintln!("daos-bed: {e:#}");
        std::process::exit(1);
    }
}

fn run(version: &str, dir: &Path, worker: Option<&Path>) -> anyhow::Result<()> {
    let stop = block_stop_signals();
    let prefix = daos_system::prefix_of(version).ok_or_else(|| {
        anyhow::anyhow!("no DAOS {version} prefix here (see docs/testing.md, \"Real DAOS\")")
    })?;
    let mut daos = DaosSystem::start(&prefix)?;
    daos.start_agent()?;
    daos.dmg_json(&["pool", "create", "--size", "4GiB", "tank"])?;
    daos.daos(&["cont", "create", "tank", "vol", "--type=POSIX"])?;
    let dfuse_dir = dir.join("dfuse");
    std::fs::create_dir_all(&dfuse_dir)?;
    let dfuse = Dfuse::mount(&daos, "tank", "vol", &dfuse_dir)?;
    println!("dfuse={}", dfuse_dir.display());
    let worker = match worker {
        Some(bin) => Some(start_worker(&daos, bin, dir)?),
        None => None,
    };
    let mut sig = 0;
    // SAFETY: waits for one of the signals blocked above.
    unsafe { libc::sigwait(&stop, &mut sig) };
    if let Some(mut w) = worker {
        dpufs_e2e::kill9(w.id());
        let _ = w.wait();
        daos_system::unmount(&dir.join("dpufs"));
    }
    drop(dfuse);
    drop(daos);
    Ok(())
}

/// A worker serving `vol` at `dir/dpufs`, once its mount is there.
fn start_worker(daos: &DaosSystem, bin: &Path, dir: &Path) -> anyhow::Result<Child> {
    let (mnt, state) = (dir.join("dpufs"), dir.join("dpufs-state"));
    std::fs::create_dir_all(&mnt)?;
    std::fs::create_dir_all(&state)?;
    let mut child = Command::new(bin)
        .arg("worker")
        .args(["--backend", "daos:tank/vol", "--daos-lib"])
        .arg(daos.prefix.lib_dir())
        .arg("--mountpoint")
        .arg(&mnt)
        .arg("--state-dir")
        .arg(&state)
        .env("DAOS_AGENT_DRPC_DIR", daos.agent_dir())
        .env("D_LOG_FILE", daos.log_dir().join("worker-libdaos.log"))
        .stdin(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !is_mount_point(&mnt) {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("the worker exited ({status}) before mounting");
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the worker did not mount in 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("dpufs={}", mnt.display());
    Ok(child)
}

/// Blocks SIGINT and SIGTERM so that `sigwait` takes them.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: plain signal-mask calls on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}
