//! Files the node's processes replace whole: records, capabilities, handover state.

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Writes `data` to `path` atomically, with permissions `mode` (before the umask): a new
/// temporary file beside it, synced, then renamed over it. A reader (a worker re-reading its
/// capability, a restarted keeper or plugin) sees the old contents or the new, never half,
/// and a crash leaves one of the two.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let tmp = temporary(path);
    let context = |e: io::Error, what: &str, p: &Path| {
        io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()))
    };
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(context(e, "remove", &tmp)),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| context(e, "create", &tmp))?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .map_err(|e| context(e, "write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| context(e, "write", path))
}

/// The temporary file of `path`: its whole name plus `.tmp`, so files that differ only in
/// their extension (a volume's `.cap` and `.qos`) never share one.
fn temporary(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_whole_files_with_their_mode() {
        let dir = std::env::temp_dir().join(format!("dpufs-node-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("capability");
        write_atomic(&path, b"first", 0o600).unwrap();
        // A temporary file a crash left behind is replaced, not an error.
        std::fs::write(dir.join("capability.tmp"), b"half").unwrap();
        write_atomic(&path, b"second", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert!(!dir.join("capability.tmp").exists());
        // Siblings that differ in their extension have temporaries of their own.
        assert_eq!(temporary(&dir.join("v.cap")), dir.join("v.cap.tmp"));
        assert_ne!(temporary(&dir.join("v.cap")), temporary(&dir.join("v.qos")));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let err = write_atomic(&dir.join("no/such/dir"), b"x", 0o600).unwrap_err();
        assert!(err.to_string().contains("no/such"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
