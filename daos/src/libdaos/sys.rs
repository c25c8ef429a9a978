//! The C ABI of libdaos and libdfs that dpufs calls: the types as they lie in memory
//! (LP64; DAOS 2.6 and 2.8 have the same layouts) and the functions, resolved by name from
//! libraries opened at run time. Nothing here is safe to call on its own: `super` wraps
//! every call and says, at each, what makes it sound.

use std::ffi::{c_char, c_int, c_void};

/// `daos_handle_t`: an opaque cookie, 0 when invalid; passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Handle {
    pub cookie: u64,
}

/// The value of a `struct daos_prop_entry`: a number, or a string or structure the
/// entry owns (freed by `daos_prop_free`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union PropEntryValue {
    pub val: u64,
    pub str_: *mut c_char,
    pub ptr: *mut c_void,
}

/// `struct daos_prop_entry`.
#[repr(C)]
pub struct PropEntry {
    pub dpe_type: u32,
    /// `DAOS_PROP_ENTRY_NOT_SET` (1) when the server has no value.
    pub dpe_flags: u16,
    pub dpe_reserv: u16,
    pub value: PropEntryValue,
}

/// `daos_prop_t`.
#[repr(C)]
pub struct Prop {
    pub dpp_nr: u32,
    pub dpp_reserv: u32,
    pub dpp_entries: *mut PropEntry,
}

/// `daos_cont_info_t`; the times are HLC timestamps.
#[repr(C)]
#[derive(Debug, Default)]
pub struct ContInfo {
    pub ci_uuid: [u8; 16],
    pub ci_lsnapshot: u64,
    pub ci_nhandles: u32,
    pub ci_nsnapshots: u32,
    pub ci_md_otime: u64,
    pub ci_md_mtime: u64,
}

/// `struct daos_pool_cont_info`, an element of `daos_pool_list_cont`'s buffer.
#[repr(C)]
pub struct PoolContInfo {
    pub pci_uuid: [u8; 16],
    pub pci_label: [c_char; 128],
}

/// `daos_pool_info_t`, of which dpufs reads the UUID and, when `pi_bits` asks for
/// `DPI_SPACE`, the pool's space (`pi_space.ps_space`: index 0 SCM, 1 NVMe).
#[repr(C)]
pub struct PoolInfo {
    pub pi_uuid: [u8; 16],
    pub pi_ntargets: u32,
    pub pi_nnodes: u32,
    pub pi_ndisabled: u32,
    pub pi_map_ver: u32,
    pub pi_leader: u32,
    pub pi_pad: u32,
    pub pi_bits: u64,
    pub s_total: [u64; 2],
    pub s_free: [u64; 2],
    /// The rest of `pi_space` and the rebuild status, which dpufs does not read.
    pub rest: [u64; 14],
}

impl PoolInfo {
    /// All zero: asks for no optional field.
    pub fn zeroed() -> PoolInfo {
        // SAFETY: every field is an integer or an array of them; zero is valid for all.
        unsafe { std::mem::zeroed() }
    }
}

/// `DPI_SPACE`: `daos_pool_query` fills `pi_space`.
pub const DPI_SPACE: u64 = 1;

// The layouts above, checked against the sizes DAOS's headers give (docs/real-daos.md).
const _: () = assert!(std::mem::size_of::<Handle>() == 8);
const _: () = assert!(std::mem::size_of::<PropEntry>() == 16);
const _: () = assert!(std::mem::size_of::<Prop>() == 16);
const _: () = assert!(std::mem::size_of::<ContInfo>() == 48);
const _: () = assert!(std::mem::size_of::<PoolContInfo>() == 144);
const _: () = assert!(std::mem::align_of::<PoolContInfo>() == 1);
const _: () = assert!(std::mem::size_of::<PoolInfo>() == 192);
const _: () = assert!(std::mem::offset_of!(PoolInfo, pi_bits) == 40);
const _: () = assert!(std::mem::offset_of!(PoolInfo, s_total) == 48);
const _: () = assert!(std::mem::offset_of!(PoolInfo, s_free) == 64);

/// `daos_anchor_t`: an opaque iteration cursor, zero at the start.
#[repr(C)]
pub struct Anchor {
    pub bytes: [u64; 15],
}

impl Anchor {
    /// A cursor at the start.
    pub fn start() -> Anchor {
        Anchor { bytes: [0; 15] }
    }

    /// Whether the iteration has ended: `da_type` (the first 16 bits) is `DAOS_ANCHOR_TYPE_EOF`.
    pub fn at_end(&self) -> bool {
        self.bytes[0] & 0xffff == 3
    }
}

/// `daos_epoch_range_t`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EpochRange {
    pub lo: u64,
    pub hi: u64,
}

/// `dfs_attr_t`: all zero means DFS's defaults.
#[repr(C)]
pub struct DfsAttr {
    pub da_id: u64,
    pub da_chunk_size: u64,
    pub da_oclass_id: u32,
    pub da_props: *mut Prop,
    pub da_mode: u32,
    pub da_dir_oclass_id: u32,
    pub da_file_oclass_id: u32,
    pub da_hints: [c_char; 128],
}

/// `dfs_t` and `dfs_obj_t`: libdfs's own structures, reached through pointers only.
pub type DfsMount = c_void;
pub type DfsObj = c_void;

/// `daos_obj_id_t`: a DAOS object's 128-bit id.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ObjId {
    pub lo: u64,
    pub hi: u64,
}

/// `d_iov_t`: a buffer (`iov_buf_len` bytes of room, `iov_len` of them meant).
#[repr(C)]
pub struct Iov {
    pub iov_buf: *mut c_void,
    pub iov_buf_len: usize,
    pub iov_len: usize,
}

/// `d_sg_list_t`: a scatter-gather list.
#[repr(C)]
pub struct SgList {
    pub sg_nr: u32,
    pub sg_nr_out: u32,
    pub sg_iovs: *mut Iov,
}

const _: () = assert!(std::mem::size_of::<ObjId>() == 16);
const _: () = assert!(std::mem::size_of::<Iov>() == 24);
const _: () = assert!(std::mem::size_of::<SgList>() == 16);
const _: () = assert!(std::mem::size_of::<libc::dirent>() == 280);
const _: () = assert!(std::mem::size_of::<DfsAttr>() == 176);
const _: () = assert!(std::mem::offset_of!(DfsAttr, da_props) == 24);
const _: () = assert!(std::mem::offset_of!(DfsAttr, da_hints) == 44);
const _: () = assert!(std::mem::size_of::<Anchor>() == 120);
const _: () = assert!(std::mem::size_of::<EpochRange>() == 16);

/// `DAOS_PROP_ENTRY_NOT_SET`.
pub const ENTRY_NOT_SET: u16 = 1;
/// `DAOS_PC_RO`, `DAOS_PC_RW`: pool connect modes.
pub const PC_RO: u32 = 1;
pub const PC_RW: u32 = 2;
/// `DAOS_COO_RO`, `DAOS_COO_RW`: container open modes.
pub const COO_RO: u32 = 1;
pub const COO_RW: u32 = 2;
/// `DFS_SET_ATTR_*`: which fields `dfs_osetattr` sets.
pub const SET_ATTR_MODE: c_int = 1;
pub const SET_ATTR_MTIME: c_int = 4;
pub const SET_ATTR_SIZE: c_int = 8;
pub const SET_ATTR_UID: c_int = 16;
pub const SET_ATTR_GID: c_int = 32;
/// `DAOS_SNAP_OPT_CR`: create a snapshot.
pub const SNAP_OPT_CR: c_int = 1;

type Event = *mut c_void;

/// `daos_event_t`: an in-flight call's completion, in an event queue.
#[repr(C)]
pub struct DaosEvent {
    pub ev_error: c_int,
    pub ev_pad: u32,
    pub ev_private: [u64; 20],
    pub ev_debug: u64,
}

impl DaosEvent {
    /// All zero, for `daos_event_init`.
    pub fn zeroed() -> DaosEvent {
        DaosEvent {
            ev_error: 0,
            ev_pad: 0,
            ev_private: [0; 20],
            ev_debug: 0,
        }
    }
}

const _: () = assert!(std::mem::size_of::<DaosEvent>() == 176);

/// `DAOS_EQ_WAIT`: `daos_eq_poll` blocks until an event completes.
pub const EQ_WAIT: i64 = -1;

macro_rules! symbols {
    ($($name:ident: fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The functions dpufs calls, resolved from the opened libraries. The pointers stay
        /// valid for the life of the process: the libraries are never closed.
        #[allow(non_snake_case)]
        pub struct Symbols {
            $(pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }

        impl Symbols {
            /// Resolves every function from `lib`, or names the first one missing.
            ///
            /// # Safety
            /// `lib` must be libdaos (with libdfs loaded into the global scope before it),
            /// whose functions have the signatures written here.
            pub unsafe fn resolve(lib: &libloading::Library) -> Result<Symbols, String> {
                Ok(Symbols {
                    $($name: {
                        let name = concat!(stringify!($name), "\0");
                        // SAFETY: the caller vouches for the signature.
                        let symbol = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(name.as_bytes())
                        };
                        *symbol.map_err(|e| format!("{}: {e}", stringify!($name)))?
                    },)*
                })
            }
        }
    };
}

symbols! {
    daos_init: fn() -> c_int;
    daos_pool_connect2: fn(*const c_char, *const c_char, u32, *mut Handle, *mut PoolInfo, Event) -> c_int;
    daos_pool_disconnect: fn(Handle, Event) -> c_int;
    daos_pool_list_cont: fn(Handle, *mut u64, *mut PoolContInfo, Event) -> c_int;
    daos_cont_open2: fn(Handle, *const c_char, u32, *mut Handle, *mut ContInfo, Event) -> c_int;
    daos_cont_close: fn(Handle, Event) -> c_int;
    daos_cont_destroy2: fn(Handle, *const c_char, c_int, Event) -> c_int;
    daos_cont_query: fn(Handle, *mut ContInfo, *mut Prop, Event) -> c_int;
    daos_prop_alloc: fn(u32) -> *mut Prop;
    daos_prop_free: fn(*mut Prop);
    daos_acl_to_strs: fn(*mut c_void, *mut *mut *mut c_char, *mut usize) -> c_int;
    d_errstr: fn(c_int) -> *const c_char;
    d_hlc2unixnsec: fn(u64) -> u64;
    dfs_cont_create_with_label: fn(Handle, *const c_char, *mut DfsAttr, *mut [u8; 16], *mut Handle, *mut *mut c_void) -> c_int;
    daos_cont_set_prop: fn(Handle, *mut Prop, Event) -> c_int;
    daos_prop_entry_set_str: fn(*mut PropEntry, *const c_char, u64) -> c_int;
    daos_cont_get_acl: fn(Handle, *mut *mut Prop, Event) -> c_int;
    daos_cont_overwrite_acl: fn(Handle, *mut c_void, Event) -> c_int;
    daos_cont_update_acl: fn(Handle, *mut c_void, Event) -> c_int;
    daos_cont_delete_acl: fn(Handle, c_int, *mut c_char, Event) -> c_int;
    daos_acl_from_strs: fn(*const *const c_char, usize, *mut *mut c_void) -> c_int;
    daos_acl_free: fn(*mut c_void);
    daos_acl_principal_from_str: fn(*const c_char, *mut c_int, *mut *mut c_char) -> c_int;
    daos_cont_list_attr: fn(Handle, *mut c_char, *mut usize, Event) -> c_int;
    daos_cont_get_attr: fn(Handle, c_int, *const *const c_char, *const *mut c_void, *mut usize, Event) -> c_int;
    daos_cont_set_attr: fn(Handle, c_int, *const *const c_char, *const *const c_void, *const usize, Event) -> c_int;
    daos_cont_del_attr: fn(Handle, c_int, *const *const c_char, Event) -> c_int;
    daos_cont_create_snap_opt: fn(Handle, *mut u64, *mut c_char, c_int, Event) -> c_int;
    daos_cont_list_snap: fn(Handle, *mut c_int, *mut u64, *mut *mut c_char, *mut Anchor, Event) -> c_int;
    daos_cont_destroy_snap: fn(Handle, EpochRange, Event) -> c_int;
    daos_pool_query: fn(Handle, *mut c_void, *mut PoolInfo, *mut Prop, Event) -> c_int;
    dfs_mount: fn(Handle, Handle, c_int, *mut *mut DfsMount) -> c_int;
    dfs_umount: fn(*mut DfsMount) -> c_int;
    dfs_lookup: fn(*mut DfsMount, *const c_char, c_int, *mut *mut DfsObj, *mut u32, *mut libc::stat) -> c_int;
    dfs_lookup_rel: fn(*mut DfsMount, *mut DfsObj, *const c_char, c_int, *mut *mut DfsObj, *mut u32, *mut libc::stat) -> c_int;
    dfs_open_stat: fn(*mut DfsMount, *mut DfsObj, *const c_char, u32, c_int, u32, u64, *const c_char, *mut *mut DfsObj, *mut libc::stat) -> c_int;
    dfs_release: fn(*mut DfsObj) -> c_int;
    dfs_obj2id: fn(*mut DfsObj, *mut ObjId) -> c_int;
    dfs_ostat: fn(*mut DfsMount, *mut DfsObj, *mut libc::stat) -> c_int;
    dfs_osetattr: fn(*mut DfsMount, *mut DfsObj, *mut libc::stat, c_int) -> c_int;
    dfs_read: fn(*mut DfsMount, *mut DfsObj, *mut SgList, u64, *mut u64, *mut DaosEvent) -> c_int;
    dfs_write: fn(*mut DfsMount, *mut DfsObj, *mut SgList, u64, *mut DaosEvent) -> c_int;
    dfs_punch: fn(*mut DfsMount, *mut DfsObj, u64, u64) -> c_int;
    daos_eq_create: fn(*mut Handle) -> c_int;
    daos_eq_destroy: fn(Handle, c_int) -> c_int;
    daos_eq_poll: fn(Handle, c_int, i64, u32, *mut *mut DaosEvent) -> c_int;
    daos_event_init: fn(*mut DaosEvent, Handle, *mut DaosEvent) -> c_int;
    daos_event_fini: fn(*mut DaosEvent) -> c_int;
    dfs_readdir: fn(*mut DfsMount, *mut DfsObj, *mut Anchor, *mut u32, *mut libc::dirent) -> c_int;
    dfs_remove: fn(*mut DfsMount, *mut DfsObj, *const c_char, bool, *mut ObjId) -> c_int;
    dfs_move: fn(*mut DfsMount, *mut DfsObj, *const c_char, *mut DfsObj, *const c_char, *mut ObjId) -> c_int;
    dfs_get_symlink_value: fn(*mut DfsObj, *mut c_char, *mut u64) -> c_int;
    dfs_setxattr: fn(*mut DfsMount, *mut DfsObj, *const c_char, *const c_void, u64, c_int) -> c_int;
    dfs_getxattr: fn(*mut DfsMount, *mut DfsObj, *const c_char, *mut c_void, *mut u64) -> c_int;
    dfs_listxattr: fn(*mut DfsMount, *mut DfsObj, *mut c_char, *mut u64) -> c_int;
    dfs_removexattr: fn(*mut DfsMount, *mut DfsObj, *const c_char) -> c_int;
}
