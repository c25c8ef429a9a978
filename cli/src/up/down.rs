//! `dpufs down`: stops what a killed `dpufs up` left behind, in the order `up` itself stops
//! things — the volume's target mount, the CSI plugins, the mount keeper (which drains its
//! workers and unmounts), workers a killed keeper left serving, the engine.

use super::node::{keeper_socket, recorded_workers, unmount_all};
use super::state::{
    CONTROLLER_PID, CSI, ENGINE, ENGINE_PID, FABRIC_DIR, KEEPER_PID, MOUNT, NODE_PID, StateDir,
    detach, mounted_fstype, runs, terminate,
};
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct DownArgs {
    /// The directory `dpufs up` used.
    #[arg(long, default_value = super::DEFAULT_DIR)]
    data_dir: PathBuf,
}

/// Stops what a killed `dpufs up` left behind and forgets it.
pub async fn down(args: DownArgs) -> anyhow::Result<()> {
    // Absolute, as `up` recorded its mounts.
    let state = StateDir::new(&std::env::current_dir()?.join(&args.data_dir));
    let mut did = false;
    // The target first: it is a bind of the staged mount, which would otherwise stay busy.
    if let Some(mp) = state.recorded(MOUNT).map(PathBuf::from)
        && mounted_fstype(&mp).is_some()
    {
        detach(&mp).with_context(|| format!("detaching {}", mp.display()))?;
        println!("detached the mount at {}", mp.display());
        did = true;
    }
    for (file, what) in [
        (NODE_PID, "the CSI node plugin"),
        (CONTROLLER_PID, "the CSI controller"),
    ] {
        if let Some(pid) = state.running(file, CSI) {
            terminate(CSI, pid, || !runs(pid, CSI)).await?;
            println!("stopped {what} (pid {pid})");
            did = true;
        }
    }
    if let Some(pid) = state.running(KEEPER_PID, CSI) {
        stop_keeper(&state, pid).await?;
        println!("stopped the mount keeper (pid {pid})");
        did = true;
    }
    // A keeper killed with -9 leaves its workers serving.
    for pid in recorded_workers(&state)
        .into_iter()
        .filter(|&p| runs(p, CSI))
    {
        terminate(CSI, pid, || !runs(pid, CSI)).await?;
        println!("stopped the volume worker (pid {pid})");
        did = true;
    }
    // A keeper killed with -9 could not unmount the staging path.
    let staging = state.staging();
    if mounted_fstype(&staging).is_some() {
        detach(&staging).with_context(|| format!("detaching {}", staging.display()))?;
        println!("detached the staged mount at {}", staging.display());
        did = true;
    }
    if let Some(pid) = state.running(ENGINE_PID, ENGINE) {
        terminate(ENGINE, pid, || !runs(pid, ENGINE)).await?;
        println!("stopped {ENGINE} (pid {pid})");
        did = true;
    }
    if let Some(dir) = state.recorded(FABRIC_DIR) {
        let _ = std::fs::remove_dir_all(dir);
    }
    if !did {
        println!(
            "nothing of `dpufs up` running (state in {})",
            state.dir.display()
        );
    }
    state.forget();
    Ok(())
}

/// Has the keeper drain and unmount whatever it still serves (nothing, when the node plugin
/// unstaged it), then stops it.
pub async fn stop_keeper(state: &StateDir, pid: u32) -> anyhow::Result<()> {
    match unmount_all(&keeper_socket(state)).await {
        Ok(unmounted) => {
            for volume in unmounted {
                println!("the mount keeper unmounted {volume}");
            }
        }
        Err(e) => eprintln!("the mount keeper (pid {pid}) could not unmount: {e:#}"),
    }
    terminate(CSI, pid, || !runs(pid, CSI)).await
}
