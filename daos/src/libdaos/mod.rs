//! DAOS's client libraries, opened at run time (feature `daos-ffi`): containers on a real
//! DAOS system, through libdaos and libdfs as DAOS's own `daos` tool and dfuse use them
//! (docs/real-daos.md). One build of dpufs runs with or without DAOS installed: a missing
//! library or function is an error that names it.
//!
//! This module is the one `unsafe` boundary: every call into C is here, with what makes it
//! sound beside it. Handles close when their Rust values drop. Calls block (libdaos with a
//! NULL event; a volume's reads and writes wait on an event queue of their thread's own);
//! async callers run them on blocking threads.
//!
//! What is here: the pool connection (`LibDaos::connect`); containers listed, created
//! (POSIX, as `daos cont create --type POSIX`), queried and destroyed (`PoolHandle`); their
//! ACL, properties, attributes and snapshots (`ContHandle`); and `ContainerAdmin` over all
//! of it (`LibDaosContainers`); and files: a container mounted as DFS, the `Dfs` interface
//! of the volume worker (`LibDfs`).

mod admin;
mod container;
mod dfs;
mod sys;

pub use admin::LibDaosContainers;
pub use container::ContHandle;
pub use dfs::LibDfs;

use crate::containers::ContainerInfo;
use crate::error::{DaosError, Result};
use dpufs_proto::daos::der::Der;
use dpufs_proto::daos::props::PropValue;
use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use sys::{Handle, Symbols};

/// libdfs's file name; its dependencies (libdaos, libdaos_common, libgurt) come with it.
const LIBDFS: &str = "libdfs.so";

/// The libraries once loaded and initialized, for the life of the process (DAOS cannot be
/// initialized again in a process that finished it).
pub struct LibDaos {
    dir: PathBuf,
    sym: Symbols,
}

/// The libraries once they loaded and initialized. A failure is not kept: the agent may
/// come up after this process, and the next call tries again.
static LOADED: Mutex<Option<&'static LibDaos>> = Mutex::new(None);

impl std::fmt::Debug for LibDaos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibDaos").field("dir", &self.dir).finish()
    }
}

impl LibDaos {
    /// Opens `dir/libdfs.so` (with libdaos behind it), resolves the functions dpufs calls and
    /// runs `daos_init`, which reaches the agent at `$DAOS_AGENT_DRPC_DIR`. Once per process
    /// when it succeeds: later calls return the same libraries, or refuse another directory;
    /// after a failure the next call tries again.
    pub fn load(dir: &Path) -> Result<&'static LibDaos> {
        let mut loaded = LOADED.lock().expect("libdaos lock");
        let lib = match *loaded {
            Some(lib) => lib,
            None => {
                let lib: &'static LibDaos =
                    Box::leak(Box::new(Self::open(dir).map_err(DaosError::Config)?));
                *loaded = Some(lib);
                lib
            }
        };
        if lib.dir != dir {
            return Err(DaosError::Config(format!(
                "libdaos is loaded from {} already; a process uses one DAOS installation",
                lib.dir.display()
            )));
        }
        Ok(lib)
    }

    fn open(dir: &Path) -> std::result::Result<LibDaos, String> {
        let path = dir.join(LIBDFS);
        // SAFETY: loading runs the libraries' constructors, which only register DAOS's
        // error tables and logging defaults; DAOS's own tools load them the same way.
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        // SAFETY: this is libdfs, whose dependency tree holds every function `Symbols`
        // names, with the signatures of DAOS 2.6 and 2.8 (docs/real-daos.md).
        let sym = unsafe { Symbols::resolve(&lib) }
            .map_err(|e| format!("{}: missing function {e}", path.display()))?;
        // The functions stay valid only while the library is loaded: it never unloads.
        std::mem::forget(lib);
        // SAFETY: daos_init takes no arguments; it is reference-counted and thread-safe.
        let rc = unsafe { (sym.daos_init)() };
        let lib = LibDaos {
            dir: dir.to_path_buf(),
            sym,
        };
        if rc != 0 {
            return Err(format!(
                "daos_init: {} (is daos_agent running, and DAOS_AGENT_DRPC_DIR its socket directory?)",
                lib.der_name(rc)
            ));
        }
        Ok(lib)
    }

    /// Seconds since the epoch of a DAOS HLC timestamp (snapshot epochs, open times).
    fn unix_seconds(&self, hlc: u64) -> u64 {
        // SAFETY: d_hlc2unixnsec is a pure conversion.
        unsafe { (self.sym.d_hlc2unixnsec)(hlc) / 1_000_000_000 }
    }

    /// `DER_NONEXIST` for -1005.
    fn der_name(&self, rc: c_int) -> String {
        // SAFETY: d_errstr returns a pointer to a static, NUL-terminated name for any code.
        let name = unsafe { CStr::from_ptr((self.sym.d_errstr)(rc)) };
        name.to_string_lossy().into_owned()
    }

    /// A libdaos return code as a result (0 is success; errors are negative DER codes).
    fn check(&self, rc: c_int, what: &str) -> Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            Err(DaosError::from_der(rc, what))
        }
    }

    /// Connects to `pool` (label or UUID) of the agent's system, read-only or for writing
    /// (creating and destroying containers need the latter).
    pub fn connect(&'static self, pool: &str, write: bool) -> Result<PoolHandle> {
        let id = c_string(pool, "pool")?;
        let mut handle = Handle::default();
        let mut info = sys::PoolInfo::zeroed();
        let mode = if write { sys::PC_RW } else { sys::PC_RO };
        // SAFETY: `id` is NUL-terminated and outlives the call; `handle` and `info` are
        // writable and of the C layouts; a NULL system means the agent's; the event is NULL
        // so the call completes before it returns.
        let rc = unsafe {
            (self.sym.daos_pool_connect2)(
                id.as_ptr(),
                std::ptr::null(),
                mode,
                &mut handle,
                &mut info,
                std::ptr::null_mut(),
            )
        };
        self.check(rc, &format!("connecting to pool {pool}"))?;
        Ok(PoolHandle {
            lib: self,
            handle,
            uuid: uuid::Uuid::from_bytes(info.pi_uuid),
        })
    }
}

/// A connection to a pool; disconnected on drop.
#[derive(Debug)]
pub struct PoolHandle {
    lib: &'static LibDaos,
    handle: Handle,
    uuid: uuid::Uuid,
}

impl Drop for PoolHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from daos_pool_connect2 and is disconnected once, here;
        // every container handle borrows this value, so none is open any more.
        let rc = unsafe { (self.lib.sym.daos_pool_disconnect)(self.handle, std::ptr::null_mut()) };
        if rc != 0 {
            tracing::warn!(pool = %self.uuid, "daos_pool_disconnect: {}", self.lib.der_name(rc));
        }
    }
}

impl PoolHandle {
    pub fn uuid(&self) -> uuid::Uuid {
        self.uuid
    }

    /// The pool's containers: (UUID, label), in DAOS's order.
    pub fn list(&self) -> Result<Vec<(uuid::Uuid, String)>> {
        let lib = self.lib;
        loop {
            let mut count: u64 = 0;
            // SAFETY: with a NULL buffer the call only writes the count into `count`.
            let rc = unsafe {
                (lib.sym.daos_pool_list_cont)(
                    self.handle,
                    &mut count,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            lib.check(rc, "listing containers")?;
            let mut buf: Vec<sys::PoolContInfo> = (0..count)
                .map(|_| sys::PoolContInfo {
                    pci_uuid: [0; 16],
                    pci_label: [0; 128],
                })
                .collect();
            let mut room = count;
            // SAFETY: `buf` holds `room` elements of the C layout; DAOS writes at most that
            // many and says how many there are in `room`.
            let rc = unsafe {
                (lib.sym.daos_pool_list_cont)(
                    self.handle,
                    &mut room,
                    buf.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            // A container created between the two calls: ask again.
            if rc == Der::Trunc.wire() {
                continue;
            }
            lib.check(rc, "listing containers")?;
            buf.truncate(room.min(count) as usize);
            return Ok(buf
                .iter()
                .map(|c| (uuid::Uuid::from_bytes(c.pci_uuid), label_of(&c.pci_label)))
                .collect());
        }
    }

    /// Creates a POSIX (DFS) container labelled `label`, as `daos cont create --type POSIX`
    /// does: owned by this process's user and group, with DAOS's default ACL, the given
    /// DAOS properties and DFS chunk size (DFS's default when `None`).
    pub fn create_posix(
        &self,
        label: &str,
        properties: &[(u32, PropValue)],
        chunk_size: Option<u64>,
    ) -> Result<uuid::Uuid> {
        let name = c_string(label, "label")?;
        let list = PropList::with(self.lib, properties)?;
        let mut attr = sys::DfsAttr {
            da_id: 0,
            da_chunk_size: chunk_size.unwrap_or(0),
            da_oclass_id: 0,
            da_props: list.0,
            da_mode: 0,
            da_dir_oclass_id: 0,
            da_file_oclass_id: 0,
            da_hints: [0; 128],
        };
        let mut uuid = [0u8; 16];
        // SAFETY: `name` is NUL-terminated; `attr` is a dfs_attr_t whose property list
        // `list` outlives the call (DFS copies it); `uuid` is 16 writable bytes; NULL
        // handle and mount pointers ask for neither back.
        let errno = unsafe {
            (self.lib.sym.dfs_cont_create_with_label)(
                self.handle,
                name.as_ptr(),
                &mut attr,
                &mut uuid,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if errno != 0 {
            return Err(from_errno(errno, &format!("creating container {label}")));
        }
        Ok(uuid::Uuid::from_bytes(uuid))
    }

    /// Destroys container `cont` (label or UUID); `force` evicts its open handles first.
    pub fn destroy(&self, cont: &str, force: bool) -> Result<()> {
        let id = c_string(cont, "container")?;
        // SAFETY: `id` is NUL-terminated and outlives the blocking call.
        let rc = unsafe {
            (self.lib.sym.daos_cont_destroy2)(
                self.handle,
                id.as_ptr(),
                c_int::from(force),
                std::ptr::null_mut(),
            )
        };
        self.lib.check(rc, &format!("destroying container {cont}"))
    }

    /// Opens container `cont` (label or UUID), read-only or for changes.
    pub fn open(&self, cont: &str, write: bool) -> Result<ContHandle<'_>> {
        let id = c_string(cont, "container")?;
        let mut handle = Handle::default();
        let mut info = sys::ContInfo::default();
        // SAFETY: `id` is NUL-terminated; `handle` and `info` are writable C layouts.
        let rc = unsafe {
            (self.lib.sym.daos_cont_open2)(
                self.handle,
                id.as_ptr(),
                if write { sys::COO_RW } else { sys::COO_RO },
                &mut handle,
                &mut info,
                std::ptr::null_mut(),
            )
        };
        self.lib.check(rc, &format!("opening container {cont}"))?;
        Ok(ContHandle { pool: self, handle })
    }

    /// What `daos cont query` shows of container `cont`, with its properties and ACL.
    pub fn query(&self, cont: &str) -> Result<ContainerInfo> {
        self.open(cont, false)?.query()
    }
}

impl LibDaos {
    /// The ACE strings of an ACL property entry.
    fn acl_strings(&self, entry: &sys::PropEntry) -> Result<Vec<String>> {
        let mut strs: *mut *mut c_char = std::ptr::null_mut();
        let mut count: usize = 0;
        // SAFETY: an ACL entry's value is a `struct daos_acl *` DAOS owns; the call
        // allocates an array of `count` malloc'ed strings, freed below with free().
        let rc = unsafe { (self.sym.daos_acl_to_strs)(entry.value.ptr, &mut strs, &mut count) };
        self.check(rc, "reading the ACL")?;
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: `strs` holds `count` valid strings; each is read once, then freed.
            unsafe {
                let s = *strs.add(i);
                out.push(string_of(s));
                libc::free(s.cast());
            }
        }
        // SAFETY: the array itself was malloc'ed by DAOS.
        unsafe { libc::free(strs.cast()) };
        Ok(out)
    }
}

/// A property list DAOS allocated, with the library that frees it on drop.
struct PropList(*mut sys::Prop, &'static LibDaos);

impl PropList {
    /// The empty list that asks a query for every property.
    fn all(lib: &'static LibDaos) -> Result<PropList> {
        // SAFETY: daos_prop_alloc(0) returns a zeroed list, or NULL without memory.
        let prop = unsafe { (lib.sym.daos_prop_alloc)(0) };
        if prop.is_null() {
            return Err(DaosError::Config("daos_prop_alloc: out of memory".into()));
        }
        Ok(PropList(prop, lib))
    }

    fn entries(&self) -> &[sys::PropEntry] {
        // SAFETY: `self.0` is a valid list; after a query DAOS has set `dpp_entries` to
        // `dpp_nr` entries (or left it NULL with 0).
        unsafe {
            let prop = &*self.0;
            if prop.dpp_entries.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(prop.dpp_entries, prop.dpp_nr as usize)
            }
        }
    }
}

impl Drop for PropList {
    fn drop(&mut self) {
        // SAFETY: the list came from daos_prop_alloc and is freed once, with its entries.
        unsafe { (self.1.sym.daos_prop_free)(self.0) }
    }
}

/// A copy of a C string DAOS owns (empty for NULL).
///
/// # Safety
/// `s` is NULL or a valid NUL-terminated string.
unsafe fn string_of(s: *const c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: as the caller promises.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// A label from a fixed, NUL-padded buffer.
fn label_of(buf: &[c_char; 128]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| DaosError::Invalid {
        message: format!("{what} {s:?} contains a NUL byte"),
        der: None,
    })
}

/// A libdfs error (a positive errno) as the error DAOS's code would have been.
fn from_errno(errno: c_int, what: &str) -> DaosError {
    let message = format!("{what}: {}", std::io::Error::from_raw_os_error(errno));
    match errno {
        libc::EEXIST => DaosError::Exists { message, der: None },
        libc::ENOENT => DaosError::NotFound { message, der: None },
        libc::EACCES | libc::EPERM => DaosError::PermissionDenied { message, der: None },
        libc::EINVAL => DaosError::Invalid { message, der: None },
        libc::ENOSPC => DaosError::NoSpace { message, der: None },
        libc::EBUSY => DaosError::Busy { message, der: None },
        _ => DaosError::Der {
            code: Der::Misc.wire(),
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without DAOS's libraries the error names the file it looked for; the tests on a
    /// real DAOS system (e2e/tests/libdaos_*.rs) cover the libraries themselves.
    #[test]
    fn a_missing_library_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = LibDaos::load(dir.path()).unwrap_err().to_string();
        let wanted = format!("cannot load {}/libdfs.so", dir.path().display());
        assert!(err.contains(&wanted), "{err}");
        // A failure is not kept: the next call tries again (and fails the same way here).
        let again = LibDaos::load(dir.path()).unwrap_err().to_string();
        assert_eq!(again, err);
    }

    #[test]
    fn libdfs_errors_become_daos_errors() {
        assert!(matches!(
            from_errno(libc::EEXIST, "x"),
            DaosError::Exists { .. }
        ));
        assert!(matches!(
            from_errno(libc::ENOENT, "x"),
            DaosError::NotFound { .. }
        ));
        assert!(matches!(
            from_errno(libc::EACCES, "x"),
            DaosError::PermissionDenied { .. }
        ));
        let other = from_errno(libc::EIO, "creating c");
        assert_eq!(other.der(), Some(Der::Misc));
        assert!(other.to_string().starts_with("creating c: "), "{other}");
    }

    #[test]
    fn labels_end_at_their_nul() {
        let mut buf = [0 as c_char; 128];
        for (i, b) in b"tank".iter().enumerate() {
            buf[i] = *b as c_char;
        }
        assert_eq!(label_of(&buf), "tank");
        assert_eq!(label_of(&[0; 128]), "");
    }
}
