//! Server processes the fixtures start: output into a log file, and a free port to give them.

use anyhow::Context;
use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// What a fixture's server does in the child between fork and exec.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Detach {
    /// Dies with the thread that started it (PR_SET_PDEATHSIG), should the test process be
    /// killed before the fixture is dropped.
    DieWithParent,
    /// A session of its own (as `setsid`): signals to the test's process group do not reach
    /// it, and its process group can be signalled whole.
    NewSession,
}

/// Spawns `cmd` with no input and its output in `log`.
pub(crate) fn spawn_logged(cmd: &mut Command, log: &Path, detach: Detach) -> anyhow::Result<Child> {
    let out = std::fs::File::create(log)?;
    // SAFETY: prctl and setsid are async-signal-safe and touch no memory of the parent.
    unsafe {
        cmd.pre_exec(move || {
            let failed = match detach {
                Detach::DieWithParent => libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0,
                Detach::NewSession => libc::setsid() < 0,
            };
            if failed {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("spawning {cmd:?}"))
}

/// A port that was free a moment ago.
pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
