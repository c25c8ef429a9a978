//! Mounting a virtio-fs device at the staging path: `mount -t virtiofs TAG PATH`, retried for a
//! short while, because a device hot-plugged a moment ago may not be probed by the host's
//! kernel yet: until it is, the mount fails with EINVAL on Linux 6.1 (the kernel logs
//! "virtio-fs: tag <…> not found"; seen in the DPU-mode guest test when a second device was
//! mounted a few milliseconds after its PCI function appeared), ENOENT or ENODEV elsewhere.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The file system type of a virtio-fs mount.
pub const FSTYPE: &str = "virtiofs";

/// How long a device may take to appear.
const APPEAR_WITHIN: Duration = Duration::from_secs(20);

fn mount_once(tag: &str, path: &Path, read_only: bool) -> io::Result<()> {
    let source = CString::new(tag).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let target = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let fstype = CString::new(FSTYPE).expect("no NUL");
    let flags = if read_only { libc::MS_RDONLY } else { 0 };
    // SAFETY: valid NUL-terminated strings; no data.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            std::ptr::null(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Mounts the device `tag` at `path`, waiting up to 20 s for it to appear.
pub fn mount(tag: &str, path: &Path, read_only: bool) -> io::Result<()> {
    let start = Instant::now();
    loop {
        match mount_once(tag, path, read_only) {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | libc::ENOENT | libc::ENODEV)
                ) && start.elapsed() < APPEAR_WITHIN =>
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}
