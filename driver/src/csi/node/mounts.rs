//! The bind mounts NodePublishVolume makes from a staged volume into a pod's target, and
//! what /proc/self/mountinfo says about a path.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A mount at a path, as mountinfo shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    /// Device of the mounted file system (a bind of the staged volume has the volume's).
    pub dev: (u32, u32),
    /// Mounted read-only (the per-mount `ro` option).
    pub read_only: bool,
}

/// The topmost mount exactly at `path`.
pub fn at(path: &Path) -> io::Result<Option<Mounted>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(parse)
        .rfind(|(p, _)| p == path)
        .map(|(_, m)| m))
}

fn parse(line: &str) -> Option<(std::path::PathBuf, Mounted)> {
    let fields: Vec<&str> = line.split(' ').collect();
    let (maj, min) = fields.get(2)?.split_once(':')?;
    let mountpoint = dpufs_node_api::mountinfo::unescape(fields.get(4)?);
    let read_only = fields.get(5)?.split(',').any(|o| o == "ro");
    let dev = (maj.parse().ok()?, min.parse().ok()?);
    Some((mountpoint, Mounted { dev, read_only }))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_device_and_read_only() {
        let line = "36 35 0:52 / /var/lib/kubelet/pods/p/volumes/x\\040y/mount ro,nosuid,relatime shared:1 - fuse.dpufs dpufs rw,user_id=0";
        let (path, m) = parse(line).unwrap();
        assert_eq!(path, Path::new("/var/lib/kubelet/pods/p/volumes/x y/mount"));
        assert_eq!(
            m,
            Mounted {
                dev: (0, 52),
                read_only: true
            }
        );
        let (_, m) = parse("36 35 0:52 / /m rw,relatime - fuse.dpufs dpufs ro").unwrap();
        assert!(!m.read_only, "only the per-mount options count");
    }
}
