//! Files written the way an application that needs them durable writes them.

use std::io::Write;
use std::os::fd::IntoRawFd;
use std::path::Path;

/// Creates (or truncates) `path` with `data`, fsyncs it and closes it, each step's error
/// returned: once this is `Ok`, the file's bytes are acknowledged as durable. `close(2)`'s own
/// error counts too (a `File`'s drop would ignore it).
pub fn write_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()?;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was just taken from the file, which no longer owns it.
    if unsafe { libc::close(fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
