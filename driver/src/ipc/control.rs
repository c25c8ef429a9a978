//! The client of a worker's control socket (`<worker state>/control.sock`).

use super::line;
use dpufs_node_api::control::{FsUsage, Health, Reply, Request, WorkerStats};
use std::io;
use std::path::Path;

/// Sends `request` to the worker whose control socket is `path` and reads its answer.
pub fn request(path: &Path, request: &Request) -> io::Result<Reply> {
    let text = line::exchange(path, &request.encode())?;
    request
        .decode_reply(&text)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The worker's health; a refusal is an error.
pub fn health(path: &Path) -> io::Result<Health> {
    match request(path, &Request::Health)? {
        Reply::Health(h) => Ok(h),
        other => Err(unexpected(other)),
    }
}

/// The worker's counters; a refusal is an error.
pub fn stats(path: &Path) -> io::Result<WorkerStats> {
    match request(path, &Request::Stats)? {
        Reply::Stats(s) => Ok(s),
        other => Err(unexpected(other)),
    }
}

/// The volume's usage as the worker's file system reports it; a refusal is an error.
pub fn statfs(path: &Path) -> io::Result<FsUsage> {
    match request(path, &Request::Statfs)? {
        Reply::Statfs(u) => Ok(u),
        other => Err(unexpected(other)),
    }
}

/// Asks the worker to stop; returns once it has said it is stopping.
pub fn stop(path: &Path) -> io::Result<()> {
    match request(path, &Request::Stop)? {
        Reply::Stopping => Ok(()),
        other => Err(unexpected(other)),
    }
}

fn unexpected(reply: Reply) -> io::Error {
    let text = match reply {
        Reply::Refused(e) => format!("the worker refused: {e}"),
        other => format!("unexpected answer {other:?}"),
    };
    io::Error::other(text)
}
