//! The bind mounts NodePublishVolume makes from a staged volume into a pod's target, and
//! what /proc/self/mountinfo says about a path.

use dpufs_node_api::mountinfo::MountInfo;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The topmost mount exactly at `path` (`dpufs_node_api::mountinfo`: its device, which a
/// bind of a staged volume shares with the volume, and whether it is read-only).
pub fn at(path: &Path) -> io::Result<Option<MountInfo>> {
    dpufs_node_api::mountinfo::find(path)
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn cvt(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Bind-mounts `source` on `target`, read-only when asked (a bind mount takes `MS_RDONLY`
/// only in a second, remounting call). On a failed remount the bind is undone: a mount that
/// should be read-only is never left writable.
pub fn bind(source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
    let (src, dst) = (cpath(source)?, cpath(target)?);
    // SAFETY: valid NUL-terminated paths; no fs type or data for a bind mount.
    cvt(unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    })?;
    if read_only {
        let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
        // SAFETY: as above.
        let r = cvt(unsafe {
            libc::mount(
                std::ptr::null(),
                dst.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        });
        if let Err(e) = r {
            let _ = unmount(target);
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts `target`; a busy or dead mount (its FUSE server gone) is detached instead.
pub fn unmount(target: &Path) -> io::Result<()> {
    let p = cpath(target)?;
    // SAFETY: valid NUL-terminated path.
    match cvt(unsafe { libc::umount2(p.as_ptr(), 0) }) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            // SAFETY: as above.
            cvt(unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) })
        }
        other => other,
    }
}
