//! Least privilege: resource limits and dropping to an unprivileged uid/gid once everything
//! that needs root (mounting, opening /dev/fuse clones, sysfs readahead, binding the control
//! socket) is done.

use std::io;

/// Resource limits set before serving.
#[derive(Clone, Debug, Default)]
pub struct Limits {
    /// RLIMIT_NOFILE (soft and hard): the worker's own descriptors plus what the backend
    /// holds (LocalDfs keeps one per object the kernel knows). `None`: the soft limit is
    /// raised to the hard one.
    pub nofile: Option<u64>,
    /// RLIMIT_NPROC (soft and hard), counted per uid: only meaningful with a per-tenant uid.
    pub nproc: Option<u64>,
}

fn cvt(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn get(resource: libc::__rlimit_resource_t) -> io::Result<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscall writing into a valid struct.
    cvt(unsafe { libc::getrlimit(resource, &mut lim) })?;
    Ok(lim)
}

/// Sets soft = hard = `value`. Raising the hard limit needs CAP_SYS_RESOURCE, which a
/// container may lack: then the limit is the current hard one, and the function says so.
fn set(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<u64> {
    let lim = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: plain syscall with a valid struct.
    match cvt(unsafe { libc::setrlimit(resource, &lim) }) {
        Ok(()) => Ok(value),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            let hard = get(resource)?.rlim_max;
            if hard >= value {
                return Err(e);
            }
            let lim = libc::rlimit {
                rlim_cur: hard,
                rlim_max: hard,
            };
            // SAFETY: as above.
            cvt(unsafe { libc::setrlimit(resource, &lim) })?;
            Ok(hard)
        }
        Err(e) => Err(e),
    }
}

/// Applies `limits`, and RLIMIT_CORE = 0 (a core dump would hold tenant data).
pub fn apply_limits(limits: &Limits) -> io::Result<()> {
    let want = match limits.nofile {
        Some(n) => n,
        None => get(libc::RLIMIT_NOFILE)?.rlim_max,
    };
    let nofile = set(libc::RLIMIT_NOFILE, want)
        .map_err(|e| io::Error::new(e.kind(), format!("RLIMIT_NOFILE {want}: {e}")))?;
    if nofile < want {
        tracing::warn!(
            "RLIMIT_NOFILE is {nofile}, not {want}: raising the hard limit needs CAP_SYS_RESOURCE"
        );
    }
    set(libc::RLIMIT_CORE, 0)?;
    if let Some(n) = limits.nproc {
        set(libc::RLIMIT_NPROC, n)
            .map_err(|e| io::Error::new(e.kind(), format!("RLIMIT_NPROC {n}: {e}")))?;
    }
    Ok(())
}

/// Drops to `uid`/`gid` for good: no supplementary groups, real = effective = saved ids (so
/// no way back to root), all capabilities gone with uid 0, and no_new_privs (no set-id or
/// file-capability gains through exec).
///
/// The process stays *dumpable*: changing uid resets it to `fs.suid_dumpable` (0), which
/// would make /proc/self root-owned and break what re-opens its own descriptors through
/// /proc/self/fd (LocalDfs does). Ptrace by other processes of the same uid is the price:
/// with one uid per tenant those are the tenant's own workers.
pub fn drop_privileges(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: plain syscalls; glibc applies set*id to every thread of the process.
    unsafe {
        cvt(libc::setgroups(0, std::ptr::null()))?;
        cvt(libc::setresgid(gid, gid, gid))?;
        cvt(libc::setresuid(uid, uid, uid))?;
        cvt(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        cvt(libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0))?;
    }
    if uid != 0 {
        // SAFETY: plain syscall; it must fail now.
        if unsafe { libc::setuid(0) } == 0 {
            return Err(io::Error::other(
                "privileges could be regained after dropping them",
            ));
        }
    }
    Ok(())
}
