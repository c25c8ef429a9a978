//! The keeper's worker processes: starting one and waiting until it serves, draining one,
//! collecting one that exited. Exits are seen through a pidfd (`pidfd_open(2)`): it becomes
//! readable when the process ends, so nothing polls a child's status on a timer.

use super::state::{StartSpec, WorkerHandle};
use crate::ipc;
use anyhow::{Context as _, Result, bail};
use dpufs_node_api::control::WorkerState;
use dpufs_node_api::transport::Transport;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a worker may take to serve after it starts, and to drain when stopped.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a starting worker's control socket is tried (between the tries, the keeper
/// waits on the worker's pidfd, so an early exit is seen at once).
const PROBE_EVERY: Duration = Duration::from_millis(2);

/// A worker process the keeper started.
#[derive(Debug)]
pub struct Worker {
    child: Child,
    /// Readable once the process has ended.
    pidfd: OwnedFd,
    generation: u32,
    /// Its state directory (control socket, session record).
    dir: PathBuf,
}

impl WorkerHandle for Worker {
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn generation(&self) -> u32 {
        self.generation
    }
}

impl Worker {
    /// Starts `binary worker <args> --transport <transport> --keeper <socket> --volume
    /// <volume> --state-dir <dir>` and waits until it answers `health` with "serving". A
    /// worker that exits or does not serve in time is killed and collected, and the error
    /// says why.
    pub fn start(
        spec: &StartSpec,
        transport: Transport,
        keeper_socket: &Path,
        volume: &str,
        dir: PathBuf,
    ) -> Result<Worker> {
        let child = Command::new(&spec.binary)
            .arg("worker")
            .args(&spec.args)
            .arg("--transport")
            .arg(transport.name())
            .arg("--keeper")
            .arg(keeper_socket)
            .arg("--volume")
            .arg(volume)
            .arg("--state-dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("start the worker {}", spec.binary.display()))?;
        // The child is ours and not reaped yet, so its pid cannot name another process.
        let pidfd = match pidfd_open(child.id()) {
            Ok(fd) => fd,
            Err(e) => {
                let mut child = child;
                let _ = child.kill();
                let _ = child.wait();
                return Err(e).context("pidfd_open");
            }
        };
        let mut worker = Worker {
            child,
            pidfd,
            generation: spec.generation,
            dir,
        };
        if let Err(e) = worker.wait_serving() {
            let _ = worker.child.kill();
            let _ = worker.child.wait();
            return Err(e);
        }
        Ok(worker)
    }

    /// Its state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A descriptor that becomes readable when the worker ends (for the supervisor's poll).
    pub fn exit_fd(&self) -> io::Result<OwnedFd> {
        self.pidfd.try_clone()
    }

    fn wait_serving(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let socket = self.dir.join("control.sock");
        loop {
            if ipc::control::health(&socket).is_ok_and(|h| h.state == WorkerState::Serving) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the worker did not serve within {} s",
                    READY_TIMEOUT.as_secs()
                );
            }
            if wait_readable(self.pidfd.as_fd(), Some(PROBE_EVERY))? {
                let status = self.child.wait()?;
                bail!("the worker exited ({status}) before serving");
            }
        }
    }

    /// Stops a worker that serves a handed descriptor: it finishes the requests it holds and
    /// exits, leaving the connection to the others. Killed if it takes longer than
    /// [`READY_TIMEOUT`]. Its state directory goes with it.
    pub fn drain(mut self) -> Result<ExitStatus> {
        let _ = ipc::control::stop(&self.dir.join("control.sock"));
        if !wait_readable(self.pidfd.as_fd(), Some(READY_TIMEOUT))? {
            let _ = self.child.kill();
            let _ = self.child.wait();
            bail!(
                "the worker did not drain within {} s",
                READY_TIMEOUT.as_secs()
            );
        }
        let status = self.child.wait()?;
        let _ = std::fs::remove_dir_all(&self.dir);
        if !status.success() {
            tracing::warn!("drained worker ended with {status}");
        }
        Ok(status)
    }

    /// Collects a worker whose pidfd said it ended. Its state directory is the caller's to
    /// remove (after reading its session record, which may be the connection's only one).
    pub fn reap(mut self) -> io::Result<ExitStatus> {
        self.child.wait()
    }
}

/// `pidfd_open(2)`: a descriptor of process `pid` (close-on-exec).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: a plain system call; it returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits until `fd` is readable, at most `timeout` (`None`: forever); whether it is.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    Ok(poll_readable(&[fd], timeout)?[0])
}

/// Waits until one of `fds` is readable, at most `timeout` (`None`: forever); which are.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let ms = match deadline {
            None => -1,
            // Rounded up, so a wait never ends before its deadline.
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .as_micros()
                .div_ceil(1000)
                .min(i32::MAX as u128) as i32,
        };
        // SAFETY: `polled` is a valid array of pollfd for the call.
        let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, ms) };
        if n >= 0 {
            return Ok(polled.iter().map(|p| p.revents != 0).collect());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// An eventfd: [`Wake::wake`] makes it readable until [`Wake::clear`].
#[derive(Debug)]
pub struct Wake(OwnedFd);

impl Wake {
    pub fn new() -> io::Result<Wake> {
        // SAFETY: a plain system call.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor.
        Ok(Wake(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A full counter (EAGAIN) is still readable.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub fn clear(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; EAGAIN when not woken.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pidfd_becomes_readable_when_the_process_ends() {
        let mut child = Command::new("sleep").arg("0.2").spawn().unwrap();
        let fd = pidfd_open(child.id()).unwrap();
        assert!(!wait_readable(fd.as_fd(), Some(Duration::ZERO)).unwrap());
        let t = Instant::now();
        assert!(wait_readable(fd.as_fd(), Some(Duration::from_secs(10))).unwrap());
        assert!(
            t.elapsed() >= Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        assert!(child.wait().unwrap().success());
    }

    #[test]
    fn a_wake_is_readable_until_cleared() {
        let w = Wake::new().unwrap();
        assert!(!wait_readable(w.fd(), Some(Duration::ZERO)).unwrap());
        w.wake();
        w.wake();
        assert!(wait_readable(w.fd(), Some(Duration::ZERO)).unwrap());
        w.clear();
        assert!(!wait_readable(w.fd(), Some(Duration::ZERO)).unwrap());
    }

    #[test]
    fn polling_times_out_at_its_deadline() {
        let w = Wake::new().unwrap();
        let t = Instant::now();
        let ready = poll_readable(&[w.fd()], Some(Duration::from_millis(30))).unwrap();
        assert_eq!(ready, vec![false]);
        assert!(t.elapsed() >= Duration::from_millis(30));
    }
}
