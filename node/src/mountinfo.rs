//! The mount table as `/proc/<pid>/mountinfo` lists it. Reading it touches no mount, so it
//! is safe on a FUSE mount nobody serves.
//!
//! A line: `36 35 98:0 /root /mnt/point rw,noatime master:1 - ext3 /dev/root rw`: mount id,
//! parent id, device, root, mount point, options, optional fields up to `-`, then file
//! system type, source and super options. Blanks and backslashes in paths are octal escapes.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The mount table of this process.
pub const SELF: &str = "/proc/self/mountinfo";

/// One mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountInfo {
    /// Device number (major, minor) of the mounted file system.
    pub dev: (u32, u32),
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// File system type (`fuse.dpufs`, `cgroup2`).
    pub fstype: String,
    /// Mount source (`dpufs`).
    pub source: String,
    /// Mounted read-only (the per-mount `ro` option, as a read-only bind mount has it).
    pub read_only: bool,
}

impl MountInfo {
    /// Reads one line; `None` for a line that is not a mount.
    pub fn parse_line(line: &str) -> Option<MountInfo> {
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().skip(6).position(|f| *f == "-")? + 6;
        if fields.len() < sep + 3 {
            return None;
        }
        let (maj, min) = fields[2].split_once(':')?;
        Some(MountInfo {
            dev: (maj.parse().ok()?, min.parse().ok()?),
            mountpoint: unescape(fields[4]),
            fstype: fields[sep + 1].to_string(),
            source: fields[sep + 2].to_string(),
            read_only: fields[5].split(',').any(|o| o == "ro"),
        })
    }

    /// The FUSE connection's number (its directory under /sys/fs/fuse/connections): the
    /// kernel's own encoding of the device number (major << 20 | minor), which differs from
    /// glibc's `makedev` once the minor passes 255.
    pub fn connection(&self) -> u64 {
        (u64::from(self.dev.0) << 20) | u64::from(self.dev.1)
    }

    /// Whether a FUSE file system is mounted (`fuse`, `fuse.<subtype>`).
    pub fn is_fuse(&self) -> bool {
        self.fstype == "fuse" || self.fstype.starts_with("fuse.")
    }
}

/// Every mount in `text`, in table order (later mounts on top of earlier ones).
pub fn parse(text: &str) -> Vec<MountInfo> {
    text.lines().filter_map(MountInfo::parse_line).collect()
}

/// This process's mounts.
pub fn read() -> io::Result<Vec<MountInfo>> {
    Ok(parse(&std::fs::read_to_string(SELF)?))
}

/// The topmost mount at exactly `mountpoint`, if any.
pub fn find(mountpoint: &Path) -> io::Result<Option<MountInfo>> {
    Ok(read()?.into_iter().rfind(|m| m.mountpoint == mountpoint))
}

/// A path field with its octal escapes (blanks, backslashes) undone. The kernel escapes a byte
/// as `\ooo`, at most `\377`; a backslash not followed by such an escape stays as it is.
pub fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && (b'0'..=b'3').contains(&b[i + 1])
            && b[i + 2..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
35 22 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate
40 22 0:52 / /mnt/a\\040b rw,nosuid,nodev,noatime - fuse.dpufs dpufs:vol rw,user_id=0
41 40 0:300 / /mnt/a\\040b rw shared:3 master:1 - fuse.dpufs dpufs rw
not a mount line
";

    #[test]
    fn lines_are_read_with_their_optional_fields() {
        let all = parse(TABLE);
        assert_eq!(all.len(), 4);
        assert_eq!(all[1].fstype, "cgroup2");
        assert_eq!(all[1].mountpoint, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(all[2].mountpoint, PathBuf::from("/mnt/a b"));
        assert_eq!(all[2].source, "dpufs:vol");
        assert!(all[2].is_fuse() && !all[0].is_fuse());
        // The topmost of the two mounts at /mnt/a b is the later one.
        let top = all
            .iter()
            .rfind(|m| m.mountpoint == Path::new("/mnt/a b"))
            .unwrap();
        assert_eq!(top.dev, (0, 300));
        assert_eq!(top.source, "dpufs");
    }

    #[test]
    fn paths_are_unescaped() {
        assert_eq!(unescape("/a\\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape("/plain"), PathBuf::from("/plain"));
        assert_eq!(unescape("/x\\134y"), PathBuf::from("/x\\y"));
        assert_eq!(unescape("/t\\011n\\012"), PathBuf::from("/t\tn\n"));
    }

    /// Found by the fuzzer (`fuzz/corpus/node_protocols/found-octal-overflow`): `\512` is no
    /// byte, and computing it overflowed.
    #[test]
    fn an_escape_past_377_stays_as_written() {
        assert_eq!(unescape("/a\\512b"), PathBuf::from("/a\\512b"));
        assert_eq!(unescape("/a\\777"), PathBuf::from("/a\\777"));
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(unescape("/a\\377").as_os_str().as_bytes(), b"/a\xff");
    }

    #[test]
    fn lines_give_device_and_read_only() {
        let line = "36 35 0:52 / /var/lib/kubelet/pods/p/volumes/x\\040y/mount ro,nosuid,relatime shared:1 - fuse.dpufs dpufs rw,user_id=0";
        let m = MountInfo::parse_line(line).unwrap();
        assert_eq!(
            m.mountpoint,
            PathBuf::from("/var/lib/kubelet/pods/p/volumes/x y/mount")
        );
        assert_eq!((m.dev, m.read_only), ((0, 52), true));
        let m = MountInfo::parse_line("36 35 0:52 / /m rw,relatime - fuse.dpufs dpufs ro").unwrap();
        assert!(!m.read_only, "only the per-mount options count");
    }

    #[test]
    fn connection_numbers_use_the_kernels_device_encoding() {
        let m = |dev| MountInfo {
            dev,
            mountpoint: "/m".into(),
            fstype: "fuse.dpufs".into(),
            source: "dpufs".into(),
            read_only: false,
        };
        assert_eq!(m((0, 42)).connection(), 42);
        assert_eq!(m((0, 300)).connection(), 300);
        assert_eq!(m((1, 2)).connection(), (1 << 20) | 2);
    }

    #[test]
    fn the_root_is_mounted_and_a_temp_dir_is_not() {
        let root = find(Path::new("/")).unwrap().expect("/ is mounted");
        assert!(!root.fstype.is_empty());
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(find(dir.path()).unwrap(), None);
    }
}
