//! Timing one phase with what it costs: wall time, this process's CPU (its threads and the
//! tools it ran) and the CPU of the target's serving processes.

use super::super::{Target, cpu, drop_caches, sync};
use super::phase::Rules;
use anyhow::Context;
use serde::Serialize;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

/// What one phase cost.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Cost {
    #[serde(rename = "wall_s", serialize_with = "seconds")]
    pub wall: Duration,
    /// This process's CPU seconds: the threads doing the work and the tools it ran.
    pub own_cpu_s: f64,
    /// CPU seconds of the target's serving processes.
    pub server_cpu_s: f64,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Runs `work` against the directory `dir` of `target` under `rules`. `work` returns the CPU
/// seconds of helper threads it ran; this thread's CPU and its waited-for children's are
/// counted here.
pub fn phase(
    target: &Target,
    dir: &Path,
    rules: Rules,
    work: impl FnOnce() -> anyhow::Result<f64>,
) -> anyhow::Result<Cost> {
    if rules.cold {
        drop_caches()?;
    } else {
        sync();
    }
    let servers = cpu::snapshot(&target.procs);
    let (thread, children) = (cpu::thread_s(), cpu::children_s());
    let start = Instant::now();
    let helpers = work()?;
    if rules.syncs {
        syncfs(dir)?;
    }
    let wall = start.elapsed();
    let own_cpu_s = helpers + (cpu::thread_s() - thread) + (cpu::children_s() - children);
    Ok(Cost {
        wall,
        own_cpu_s,
        server_cpu_s: cpu::spent(&servers, &cpu::snapshot(&target.procs)),
    })
}

/// syncfs(2) (`sync -f`) of the file system holding `dir`. On FUSE this writes back the
/// kernel's dirty pages; the kernel forwards no syncfs to user-space daemons (only to virtiofs).
fn syncfs(dir: &Path) -> anyhow::Result<()> {
    let d = File::open(dir).with_context(|| format!("open {}", dir.display()))?;
    // SAFETY: the descriptor is open for the duration of the call.
    if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("syncfs {}", dir.display()));
    }
    Ok(())
}
