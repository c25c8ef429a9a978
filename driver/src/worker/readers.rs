//! The FUSE transport: one reader thread per cloned `/dev/fuse` descriptor (the request loop
//! is `channel.rs`), and how they stop — an unmount when the worker mounted, a drain when it
//! serves a descriptor someone else holds.

use super::channel::{self, ChannelEnd};
use super::control::Shared;
use super::fs::DfsFs;
use crate::fuse::ReadAhead;
use anyhow::Result;
use fuse_backend_rs::api::server::Server;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::thread::JoinHandleExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

/// The reader threads of one FUSE connection.
#[derive(Debug)]
pub(super) struct FuseReaders {
    handles: Vec<JoinHandle<io::Result<ChannelEnd>>>,
    /// The connection's master descriptor: held (never read) so the connection outlives
    /// the reader clones; when the worker mounted, closing it last ends the connection.
    _master: OwnedFd,
    /// Set when the worker mounted and must unmount.
    owned_mount: Option<PathBuf>,
}

impl FuseReaders {
    /// Starts one reader per clone. `read_ahead` is written again after INIT, which lowers
    /// it to the INIT reply's value.
    pub fn start(
        server: &Arc<Server<Arc<DfsFs>>>,
        shared: &Arc<Shared>,
        master: OwnedFd,
        clones: Vec<OwnedFd>,
        read_ahead: Arc<Option<ReadAhead>>,
        owned_mount: Option<PathBuf>,
    ) -> io::Result<FuseReaders> {
        channel::install_wake_handler()?;
        let mut handles = Vec::new();
        for (i, clone) in clones.into_iter().enumerate() {
            let (server, shared, read_ahead) = (server.clone(), shared.clone(), read_ahead.clone());
            let h = std::thread::Builder::new()
                .name(format!("fuse-{i}"))
                .spawn(move || {
                    let after_init = || {
                        if let Some(ra) = read_ahead.as_ref() {
                            ra.apply();
                        }
                    };
                    let r = channel::serve_channel(
                        &clone,
                        &server,
                        &shared.stop_reading,
                        &shared.stats,
                        &after_init,
                    );
                    match &r {
                        Ok(end) => tracing::debug!("reader {i}: {end:?}"),
                        Err(e) => tracing::error!("reader {i}: {e}"),
                    }
                    shared.thread_ended();
                    r
                })?;
            handles.push(h);
        }
        Ok(FuseReaders {
            handles,
            _master: master,
            owned_mount,
        })
    }

    /// Whether the worker mounted (the session ends with the mount).
    pub fn owns_mount(&self) -> bool {
        self.owned_mount.is_some()
    }

    /// Serves until stopped or until the connection ends: see [`super::Worker::wait`].
    pub fn wait(mut self, shared: &Shared) -> Result<()> {
        let mut unmounted = false;
        loop {
            shared.wait_for_stop();
            if shared.live_threads.load(Ordering::Acquire) == 0 {
                break;
            }
            match &self.owned_mount {
                Some(mp) if !unmounted => {
                    unmounted = true;
                    unmount_owned(mp)?;
                }
                // Wait for the kernel to end the connection.
                Some(_) => shared.wait_changed(Duration::from_millis(200)),
                None => {
                    self.wake_to_stop(shared);
                    shared.wait_changed(Duration::from_millis(5));
                }
            }
        }
        self.join()
    }

    /// A drain: readers finish the request in hand, then see the flag (woken from read(2)
    /// by the signal).
    fn wake_to_stop(&self, shared: &Shared) {
        shared.stop_reading.store(true, Ordering::Release);
        for h in &self.handles {
            if !h.is_finished() {
                // SAFETY: the thread is alive (not finished, not joined), so its pthread_t
                // is valid.
                unsafe { libc::pthread_kill(h.as_pthread_t(), channel::WAKE_SIGNAL) };
            }
        }
    }

    fn join(&mut self) -> Result<()> {
        let mut failed = None;
        for h in self.handles.drain(..) {
            match h.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => failed = Some(anyhow::Error::from(e)),
                Err(_) => failed = Some(anyhow::anyhow!("a reader thread panicked")),
            }
        }
        match failed {
            Some(e) => Err(e.context("a FUSE reader failed")),
            None => Ok(()),
        }
    }
}

/// Unmounts the worker's own mount: at once when idle, else detached (open files stay
/// served until closed).
fn unmount_owned(mp: &Path) -> Result<()> {
    match crate::fuse::unmount(mp, false) {
        Ok(()) => tracing::info!("unmounted {}", mp.display()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            tracing::info!(
                "{} is busy: detached; serving open files until they are closed",
                mp.display()
            );
            crate::fuse::unmount(mp, true)?;
        }
        // Already gone (unmounted by someone else).
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
        Err(e) => {
            tracing::warn!("unmount {}: {e}; detaching", mp.display());
            let _ = crate::fuse::unmount(mp, true);
        }
    }
    Ok(())
}
