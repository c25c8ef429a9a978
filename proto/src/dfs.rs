//! The DFS vocabulary both ends of the engine's data protocol (`dpufs.engine.v1.Dfs*`) share:
//! the errno a DFS call fails with, the limits of names, symlinks, attributes and I/O, and the
//! one check of an entry name. The engine (which serves DFS) and the clients (which use it, and
//! pass the errno on to the kernel) take all of it from here, so an errno or a limit cannot mean
//! one thing on one side and another on the other.

use std::fmt;

/// A Linux errno value. An open set: the engine sends the numbers below, and a client backend
/// over a local file system passes through whatever that system said.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

/// Declares the errno constants once, with their symbolic names for logs and metrics.
macro_rules! errnos {
    ($($name:ident = $value:literal $(as $sym:literal)?,)*) => {
        impl Errno {
            $(
                #[doc = concat!("Linux errno ", stringify!($value), ".")]
                pub const $name: Errno = Errno($value);
            )*

            /// The symbolic name (`ENOENT`), or `errno_N` for a value not listed here.
            pub fn name(self) -> String {
                match self.0 {
                    $($value => errno_symbol!($name $(, $sym)?).to_string(),)*
                    n => format!("errno_{n}"),
                }
            }
        }
    };
}

/// An errno's symbol: `E` and its constant's name, unless it is given.
macro_rules! errno_symbol {
    ($name:ident) => {
        concat!("E", stringify!($name))
    };
    ($name:ident, $sym:literal) => {
        $sym
    };
}

// Linux's values (asm-generic/errno-base.h and errno.h), the ones DFS calls and the FUSE
// worker use; the engine never sends a number outside this list.
errnos! {
    PERM = 1,
    NOENT = 2,
    INTR = 4,
    IO = 5,
    NXIO = 6,
    TOOBIG = 7 as "E2BIG",
    BADF = 9,
    AGAIN = 11,
    NOMEM = 12,
    ACCES = 13,
    BUSY = 16,
    EXIST = 17,
    XDEV = 18,
    NODEV = 19,
    NOTDIR = 20,
    ISDIR = 21,
    INVAL = 22,
    MFILE = 24,
    NOTTY = 25,
    FBIG = 27,
    NOSPC = 28,
    SPIPE = 29,
    ROFS = 30,
    RANGE = 34,
    NAMETOOLONG = 36,
    NOSYS = 38,
    NOTEMPTY = 39,
    LOOP = 40,
    NODATA = 61,
    PROTO = 71,
    OVERFLOW = 75,
    ILSEQ = 84,
    OPNOTSUPP = 95,
    CONNABORTED = 103,
    NOTCONN = 107,
    TIMEDOUT = 110,
    STALE = 116,
    DQUOT = 122,
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({})",
            std::io::Error::from_raw_os_error(self.0),
            self.0
        )
    }
}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.0)
    }
}

/// A failed DFS call: the errno a POSIX caller sees, and why (for logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DfsError {
    /// What the caller sees.
    pub errno: Errno,
    /// Why.
    pub detail: String,
}

impl DfsError {
    /// An error with `errno` and a reason.
    pub fn new(errno: Errno, detail: impl Into<String>) -> DfsError {
        DfsError {
            errno,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for DfsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.errno, self.detail)
    }
}

impl std::error::Error for DfsError {}

/// Result of a DFS call.
pub type DfsResult<T> = Result<T, DfsError>;

/// Longest entry name in bytes (`NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// Longest symlink target in bytes (`PATH_MAX` less its NUL).
pub const SYMLINK_MAX: usize = 4095;

/// Largest extended attribute value (DFS's limit, below the 64 KiB message limit).
pub const XATTR_VALUE_MAX: usize = 63 << 10;

/// Largest list of extended attribute names, each with its NUL (below the message limit).
pub const XATTR_LIST_MAX: usize = 60 << 10;

/// Largest Read or Write one call moves (`MountInfo.max_io`).
pub const MAX_IO: usize = 1 << 20;

/// Largest Read or Write carried inline in the messages (`MountInfo.max_inline`): well below
/// the 64 KiB message limit. Below this size the copy into the message costs less than the
/// RDMA round trip and the scoped rkey it replaces.
pub const MAX_INLINE: usize = 16 << 10;

/// Most entries in one ReadDir reply: 200 names of 255 bytes and their fields stay below the
/// 64 KiB message limit.
pub const READDIR_BATCH: usize = 200;

/// Most entries in one ReadDir reply with attributes (`ReadDir.plus`): 150 names of 255
/// bytes with their fields and attributes (about 380 bytes each) stay below 64 KiB.
pub const READDIR_PLUS_BATCH: usize = 150;

/// `mode` without the set-ID bits that a write or truncation by a caller without
/// `CAP_FSETID`, or any chown, clears (Linux's `setattr_should_drop_sgid`): set-user-ID
/// always; set-group-ID when the file is group-executable or the caller is not in its group
/// (without group execute the bit means mandatory locking, which a group member may keep).
pub fn without_set_id(mode: u32, caller_in_group: bool) -> u32 {
    const S_ISUID: u32 = 0o4000;
    const S_ISGID: u32 = 0o2000;
    const S_IXGRP: u32 = 0o0010;
    let mut kill = S_ISUID;
    if mode & S_IXGRP != 0 || !caller_in_group {
        kill |= S_ISGID;
    }
    mode & !kill
}

/// The mode and group a new object gets in a directory of mode `parent_mode` and group
/// `parent_gid`, asked for with `mode` (type and permission bits) and the caller's `gid`: in
/// a set-group-ID directory it takes the directory's group, and a new directory is
/// set-group-ID too (Linux's `inode_init_owner`).
pub fn owner_in_dir(parent_mode: u32, parent_gid: u32, mode: u32, gid: u32) -> (u32, u32) {
    const S_ISGID: u32 = 0o2000;
    const S_IFMT: u32 = 0o170000;
    const S_IFDIR: u32 = 0o040000;
    if parent_mode & S_ISGID == 0 {
        return (mode, gid);
    }
    if mode & S_IFMT == S_IFDIR {
        (mode | S_ISGID, parent_gid)
    } else {
        (mode, parent_gid)
    }
}

/// Checks an entry name as DFS does: a single path component (not empty, `.`, `..`, no `/` or
/// NUL: EINVAL) of at most [`NAME_MAX`] bytes (ENAMETOOLONG).
pub fn check_name(name: &str) -> DfsResult<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(DfsError::new(
            Errno::INVAL,
            format!("invalid entry name {name:?}"),
        ));
    }
    if name.len() > NAME_MAX {
        return Err(DfsError::new(
            Errno::NAMETOOLONG,
            format!("entry name of {} bytes", name.len()),
        ));
    }
    Ok(())
}

/// Namespaces an xattr name must start with; `system.` (POSIX ACLs) is not supported by DFS.
const XATTR_PREFIXES: [&str; 3] = ["user.", "trusted.", "security."];

/// Checks an xattr name as Linux does: 1 to [`NAME_MAX`] bytes (ERANGE), in a namespace
/// DFS keeps (EOPNOTSUPP).
pub fn check_xattr_name(name: &str) -> DfsResult<()> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(DfsError::new(
            Errno::RANGE,
            "attribute name must be 1 to 255 bytes",
        ));
    }
    if !XATTR_PREFIXES
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len())
    {
        return Err(DfsError::new(
            Errno::OPNOTSUPP,
            format!("attribute {name:?} is not in the user, trusted or security namespace"),
        ));
    }
    Ok(())
}

/// Whether xattr `name` may exist on an object of type `kind` (`S_IFMT` bits): as on Linux,
/// `user.` attributes only on files and directories (others: EPERM to change, ENODATA to read).
pub fn xattr_allowed_on(kind: u32, name: &str) -> bool {
    const S_IFREG: u32 = 0o100000;
    const S_IFDIR: u32 = 0o040000;
    !name.starts_with("user.") || kind == S_IFREG || kind == S_IFDIR
}

/// The cookie of a name: a 63-bit hash that is never 0 (0 starts a listing) and never
/// changes (the engine stores it in the entry's key; libdfs-backed listings resume by it). FNV-1a, then a 64-bit finalizer so similar
/// names spread over the whole range.
pub fn name_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    (h >> 1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_values_and_names_are_linuxs() {
        // io::Error knows the platform's numbers: each constant must describe itself the way
        // the kernel describes that number.
        let cases = [
            (Errno::NOENT, "No such file or directory", "ENOENT"),
            (Errno::NOSPC, "No space left on device", "ENOSPC"),
            (Errno::STALE, "Stale file handle", "ESTALE"),
            (Errno::NODATA, "No data available", "ENODATA"),
            (Errno::OPNOTSUPP, "Operation not supported", "EOPNOTSUPP"),
            (Errno::DQUOT, "Disk quota exceeded", "EDQUOT"),
            (Errno::NAMETOOLONG, "File name too long", "ENAMETOOLONG"),
            (Errno::TOOBIG, "Argument list too long", "E2BIG"),
        ];
        for (errno, text, name) in cases {
            let io = std::io::Error::from(errno);
            assert!(io.to_string().starts_with(text), "{errno:?}: {io}");
            assert_eq!(errno.name(), name);
        }
        assert_eq!(Errno(4242).name(), "errno_4242");
    }

    #[test]
    fn names_are_checked() {
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert_eq!(check_name(bad).unwrap_err().errno, Errno::INVAL, "{bad:?}");
        }
        assert_eq!(
            check_name(&"x".repeat(NAME_MAX + 1)).unwrap_err().errno,
            Errno::NAMETOOLONG
        );
        check_name(&"x".repeat(NAME_MAX)).unwrap();
        check_name("...").unwrap();
    }

    #[test]
    fn hashes_are_nonzero_63_bits_and_spread() {
        let names: Vec<String> = (0..10_000).map(|i| format!("file{i}")).collect();
        let mut hashes: Vec<u64> = names.iter().map(|n| name_hash(n)).collect();
        assert!(hashes.iter().all(|&h| h != 0 && h < 1 << 63));
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), names.len());
    }
}
