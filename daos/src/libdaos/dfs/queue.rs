//! Reads and writes through an event queue of the calling thread's own.
//!
//! A blocking libdaos call progresses the one network context every blocking caller shares,
//! so the worker's FUSE threads wait on each other there (dfuse avoids it with event
//! queues too). Each thread that does I/O gets a queue, which has a network context of its
//! own, made on first use and destroyed when the thread ends; a thread that cannot have one
//! makes the blocking call.

use super::super::{LibDaos, sys};
use super::check;
use crate::dfs::{DfsError, DfsResult, Errno};
use dpufs_proto::daos::der::Der;
use std::cell::RefCell;
use std::ffi::c_int;
use sys::{DaosEvent, Handle};

/// How long a call's completion is polled for before the thread blocks on it.
const SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// A thread's queue, destroyed with the thread.
struct ThreadQueue {
    lib: &'static LibDaos,
    eq: Handle,
}

impl Drop for ThreadQueue {
    fn drop(&mut self) {
        // SAFETY: the queue came from daos_eq_create and has no event left: every call
        // polled its own before returning.
        unsafe { (self.lib.sym.daos_eq_destroy)(self.eq, 0) };
    }
}

thread_local! {
    /// `None` inside: this thread could not have a queue (it makes blocking calls).
    static QUEUE: RefCell<Option<Option<ThreadQueue>>> = const { RefCell::new(None) };
}

/// This thread's queue, made on first use.
fn queue(lib: &'static LibDaos) -> Option<Handle> {
    QUEUE.with(|q| {
        let mut q = q.borrow_mut();
        let made = q.get_or_insert_with(|| {
            let mut eq = Handle::default();
            // SAFETY: writes a new queue's handle into `eq`.
            let rc = unsafe { (lib.sym.daos_eq_create)(&mut eq) };
            if rc != 0 {
                tracing::warn!("daos_eq_create: {}: blocking calls", lib.der_name(rc));
                return None;
            }
            Some(ThreadQueue { lib, eq })
        });
        made.as_ref().map(|t| t.eq)
    })
}

/// Runs `launch` (a dfs_read or dfs_write given an event) to completion: on this thread's
/// queue when it has one, else blocking (a NULL event).
pub(super) fn run(
    lib: &'static LibDaos,
    what: &str,
    launch: impl FnOnce(*mut DaosEvent) -> c_int,
) -> DfsResult<()> {
    let Some(eq) = queue(lib) else {
        return check(launch(std::ptr::null_mut()), what);
    };
    let mut ev = DaosEvent::zeroed();
    // SAFETY: `ev` is a zeroed event, attached to this thread's queue; it stays in place
    // until daos_event_fini below.
    let rc = unsafe { (lib.sym.daos_event_init)(&mut ev, eq, std::ptr::null_mut()) };
    if rc != 0 {
        return check(launch(std::ptr::null_mut()), what);
    }
    let launched = launch(&mut ev);
    let result = if launched != 0 {
        check(launched, what)
    } else {
        wait(lib, eq, &mut ev, what)
    };
    // SAFETY: the event has completed (or never launched) and is finalized once.
    unsafe { (lib.sym.daos_event_fini)(&mut ev) };
    result
}

/// Waits for `ev`, the only event of queue `eq`, and returns its outcome.
fn wait(lib: &'static LibDaos, eq: Handle, ev: &mut DaosEvent, what: &str) -> DfsResult<()> {
    let mut done: *mut DaosEvent = std::ptr::null_mut();
    let spin_until = std::time::Instant::now() + SPIN;
    loop {
        // Progressed by polling for a moment (a small read is done in tens of microseconds),
        // then by blocking until it completes.
        let timeout = if std::time::Instant::now() < spin_until {
            0
        } else {
            sys::EQ_WAIT
        };
        // SAFETY: polls this thread's queue for one event; `done` is written.
        let n = unsafe { (lib.sym.daos_eq_poll)(eq, 0, timeout, 1, &mut done) };
        match n {
            1 => break,
            0 => continue,
            rc => {
                return Err(DfsError::new(
                    Errno::IO,
                    format!("{what}: daos_eq_poll: {}", lib.der_name(rc)),
                ));
            }
        }
    }
    match ev.ev_error {
        0 => Ok(()),
        // libdfs reports a positive errno, the layers below it a negative DER code.
        e if e > 0 => check(e, what),
        der => Err(DfsError::new(
            errno_of_der(der),
            format!("{what}: {}", lib.der_name(der)),
        )),
    }
}

/// The errno libdfs gives a DER code (its `daos_der2errno`), for the codes I/O can meet.
fn errno_of_der(rc: c_int) -> Errno {
    match Der::from_code(rc.saturating_neg()) {
        Some(Der::NoPerm) => Errno::PERM,
        Some(Der::Nonexist | Der::Enoent) => Errno::NOENT,
        Some(Der::Inval | Der::NoHdl) => Errno::INVAL,
        Some(Der::Exist) => Errno::EXIST,
        Some(Der::NoSpace) => Errno::NOSPC,
        Some(Der::NoMem) => Errno::NOMEM,
        Some(Der::TimedOut) => Errno::TIMEDOUT,
        Some(Der::Busy) => Errno::BUSY,
        Some(Der::Again) => Errno::AGAIN,
        Some(Der::Stale) => Errno::STALE,
        Some(Der::NotSupported) => Errno::OPNOTSUPP,
        _ => Errno::IO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_codes_become_libdfs_errnos() {
        assert_eq!(errno_of_der(-1007), Errno::NOSPC);
        assert_eq!(errno_of_der(-1001), Errno::PERM);
        assert_eq!(errno_of_der(-1005), Errno::NOENT);
        assert_eq!(errno_of_der(-2001), Errno::IO);
        assert_eq!(errno_of_der(-1025), Errno::IO);
    }
}
