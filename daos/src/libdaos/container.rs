//! An open container and what can be done through it: query, properties, ACL,
//! attributes, snapshots. Every call is blocking; the SAFETY comments say why its
//! pointers are valid.

use super::{LibDaos, PoolHandle, PropList, c_string, string_of, sys};
use crate::containers::ContainerInfo;
use crate::error::{DaosError, Result};
use crate::mgmt::Acl;
use dpufs_proto::daos::props::{self, PropValue};
use std::collections::BTreeMap;
use std::ffi::{CString, c_char, c_int, c_void};
use sys::Handle;

/// An open container; closed on drop, before its pool can be disconnected.
#[derive(Debug)]
pub struct ContHandle<'p> {
    pub(super) pool: &'p PoolHandle,
    pub(super) handle: Handle,
}

impl Drop for ContHandle<'_> {
    fn drop(&mut self) {
        self.pool.lib.close_container(self.handle);
    }
}

impl LibDaos {
    /// Closes a container handle from daos_cont_open2, once.
    pub(super) fn close_container(&self, handle: Handle) {
        // SAFETY: the caller's handle came from daos_cont_open2 and is closed once, here.
        let rc = unsafe { (self.sym.daos_cont_close)(handle, std::ptr::null_mut()) };
        if rc != 0 {
            tracing::warn!("daos_cont_close: {}", self.der_name(rc));
        }
    }
}

/// `CO_ROOTS`: the DFS superblock and root objects, a structure dpufs does not show.
const CONT_ROOTS: u32 = 0x1011;

/// Property entries DAOS filled: every set value by number, and the ACL with its owner
/// and group (kept in the properties too, as strings).
fn decode(lib: &LibDaos, entries: &[sys::PropEntry]) -> Result<(BTreeMap<u32, PropValue>, Acl)> {
    let mut properties = BTreeMap::new();
    let mut acl = Acl {
        entries: Vec::new(),
        owner_user: String::new(),
        owner_group: String::new(),
    };
    for entry in entries {
        if entry.dpe_flags & sys::ENTRY_NOT_SET != 0 {
            continue;
        }
        match entry.dpe_type {
            props::CONT_ACL => acl.entries = lib.acl_strings(entry)?,
            CONT_ROOTS => {}
            n @ (props::CONT_LABEL | props::CONT_OWNER | props::CONT_GROUP) => {
                // SAFETY: DAOS stores these three as NUL-terminated strings it owns.
                let text = unsafe { string_of(entry.value.str_) };
                match n {
                    props::CONT_OWNER => acl.owner_user = text.clone(),
                    props::CONT_GROUP => acl.owner_group = text.clone(),
                    _ => {}
                }
                properties.insert(n, PropValue::Str(text));
            }
            // SAFETY: every other container property is a number.
            n => {
                properties.insert(n, PropValue::Num(unsafe { entry.value.val }));
            }
        }
    }
    Ok((properties, acl))
}

impl ContHandle<'_> {
    fn lib(&self) -> &'static LibDaos {
        self.pool.lib
    }

    /// The container's UUID, counts and every property the server holds.
    pub fn query(&self) -> Result<ContainerInfo> {
        let lib = self.lib();
        let mut info = sys::ContInfo::default();
        let all = PropList::all(lib)?;
        // SAFETY: `info` is a writable C layout; `all.0` is an empty list from
        // daos_prop_alloc(0), which asks for every property and which DAOS fills with
        // entries it allocates (freed with the list).
        let rc = unsafe {
            (lib.sym.daos_cont_query)(self.handle, &mut info, all.0, std::ptr::null_mut())
        };
        lib.check(rc, "querying the container")?;
        let (properties, acl) = decode(lib, all.entries())?;
        let label = match properties.get(&props::CONT_LABEL) {
            Some(PropValue::Str(l)) => l.clone(),
            _ => String::new(),
        };
        Ok(ContainerInfo {
            pool_uuid: self.pool.uuid.to_string(),
            uuid: uuid::Uuid::from_bytes(info.ci_uuid).to_string(),
            label,
            properties,
            acl,
            snapshot_count: info.ci_nsnapshots,
            // DAOS keeps no creation time; the metadata open time is the closest it has.
            created_unix: lib.unix_seconds(info.ci_md_otime),
        })
    }

    /// The ACL with the owner and owner group (`daos cont get-acl`).
    pub fn acl(&self) -> Result<Acl> {
        let lib = self.lib();
        let mut prop: *mut sys::Prop = std::ptr::null_mut();
        // SAFETY: DAOS allocates a three-entry list (ACL, owner, group) into `prop`,
        // which PropList frees.
        let rc =
            unsafe { (lib.sym.daos_cont_get_acl)(self.handle, &mut prop, std::ptr::null_mut()) };
        lib.check(rc, "reading the ACL")?;
        let list = PropList(prop, lib);
        Ok(decode(lib, list.entries())?.1)
    }

    /// Replaces the whole ACL, or (`update`) adds and replaces the given entries.
    pub fn write_acl(&self, entries: &[String], update: bool) -> Result<Acl> {
        let lib = self.lib();
        let strings: Vec<CString> = entries
            .iter()
            .map(|e| c_string(e, "ACL entry"))
            .collect::<Result<_>>()?;
        let pointers: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        let mut acl: *mut c_void = std::ptr::null_mut();
        // SAFETY: `pointers` holds `len` NUL-terminated strings alive for the call; DAOS
        // allocates the parsed ACL into `acl`, freed below with daos_acl_free.
        let rc =
            unsafe { (lib.sym.daos_acl_from_strs)(pointers.as_ptr(), pointers.len(), &mut acl) };
        lib.check(rc, "parsing the ACL")?;
        let write = if update {
            lib.sym.daos_cont_update_acl
        } else {
            lib.sym.daos_cont_overwrite_acl
        };
        // SAFETY: `acl` is the valid ACL just parsed; the call copies it.
        let rc = unsafe { write(self.handle, acl, std::ptr::null_mut()) };
        // SAFETY: freed once, after its last use.
        unsafe { (lib.sym.daos_acl_free)(acl) };
        lib.check(rc, "writing the ACL")?;
        self.acl()
    }

    /// Removes the entry of `principal` (`u:name@`, `g:name@`, `OWNER@`, `GROUP@`,
    /// `EVERYONE@`, as `daos cont delete-acl` names them).
    pub fn delete_acl(&self, principal: &str) -> Result<Acl> {
        let lib = self.lib();
        let text = c_string(principal, "principal")?;
        let mut kind: c_int = 0;
        let mut name: *mut c_char = std::ptr::null_mut();
        // SAFETY: `text` is NUL-terminated; DAOS writes the type and allocates the name
        // (NULL for the special principals), freed below with free().
        let rc =
            unsafe { (lib.sym.daos_acl_principal_from_str)(text.as_ptr(), &mut kind, &mut name) };
        lib.check(rc, &format!("principal {principal:?}"))?;
        // SAFETY: `name` is NULL or the string just allocated.
        let rc = unsafe {
            (lib.sym.daos_cont_delete_acl)(self.handle, kind, name, std::ptr::null_mut())
        };
        // SAFETY: allocated by DAOS with malloc; free(NULL) is a no-op.
        unsafe { libc::free(name.cast()) };
        lib.check(rc, &format!("deleting the ACL entry of {principal}"))?;
        self.acl()
    }

    /// Sets DAOS container properties, all or none (dpufs's own numbers are not DAOS's:
    /// callers keep those elsewhere).
    pub fn set_properties(&self, values: &[(u32, PropValue)]) -> Result<()> {
        let lib = self.lib();
        let list = PropList::with(lib, values)?;
        // SAFETY: `list` is a valid list of `values.len()` entries; the call copies it.
        let rc = unsafe { (lib.sym.daos_cont_set_prop)(self.handle, list.0, std::ptr::null_mut()) };
        lib.check(rc, "setting container properties")
    }

    /// Every attribute and its value.
    pub fn attributes(&self) -> Result<BTreeMap<String, Vec<u8>>> {
        let names = self.attribute_names()?;
        let mut out = BTreeMap::new();
        for name in names {
            let value = self.attribute(&name)?;
            out.insert(name, value);
        }
        Ok(out)
    }

    fn attribute_names(&self) -> Result<Vec<String>> {
        let lib = self.lib();
        let mut size: usize = 0;
        // SAFETY: a NULL buffer with size 0 asks for the total size of the names.
        let rc = unsafe {
            (lib.sym.daos_cont_list_attr)(
                self.handle,
                std::ptr::null_mut(),
                &mut size,
                std::ptr::null_mut(),
            )
        };
        lib.check(rc, "listing attributes")?;
        if size == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0 as c_char; size];
        let mut room = size;
        // SAFETY: `buf` has `room` writable bytes; DAOS writes whole NUL-terminated names.
        let rc = unsafe {
            (lib.sym.daos_cont_list_attr)(
                self.handle,
                buf.as_mut_ptr(),
                &mut room,
                std::ptr::null_mut(),
            )
        };
        lib.check(rc, "listing attributes")?;
        let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
        Ok(bytes
            .split(|&b| b == 0)
            .filter(|n| !n.is_empty())
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect())
    }

    fn attribute(&self, name: &str) -> Result<Vec<u8>> {
        let lib = self.lib();
        let cname = c_string(name, "attribute")?;
        let names = [cname.as_ptr()];
        let mut size: usize = 0;
        let none: [*mut c_void; 1] = [std::ptr::null_mut()];
        // SAFETY: one name; a NULL buffer asks for the value's size.
        let rc = unsafe {
            (lib.sym.daos_cont_get_attr)(
                self.handle,
                1,
                names.as_ptr(),
                none.as_ptr(),
                &mut size,
                std::ptr::null_mut(),
            )
        };
        lib.check(rc, &format!("reading attribute {name}"))?;
        let mut value = vec![0u8; size];
        let buffers = [value.as_mut_ptr().cast::<c_void>()];
        // SAFETY: `value` has `size` writable bytes; DAOS writes at most that many.
        let rc = unsafe {
            (lib.sym.daos_cont_get_attr)(
                self.handle,
                1,
                names.as_ptr(),
                buffers.as_ptr(),
                &mut size,
                std::ptr::null_mut(),
            )
        };
        lib.check(rc, &format!("reading attribute {name}"))?;
        value.truncate(size);
        Ok(value)
    }

    /// Sets attributes; an empty value deletes one (DAOS refuses empty values).
    pub fn set_attributes(&self, attrs: &BTreeMap<String, Vec<u8>>) -> Result<()> {
        let lib = self.lib();
        let (gone, set): (Vec<_>, Vec<_>) = attrs.iter().partition(|(_, v)| v.is_empty());
        let existing = self.attribute_names()?;
        let gone: Vec<CString> = gone
            .iter()
            .filter(|(n, _)| existing.contains(n))
            .map(|(n, _)| c_string(n, "attribute"))
            .collect::<Result<_>>()?;
        if !gone.is_empty() {
            let names: Vec<*const c_char> = gone.iter().map(|n| n.as_ptr()).collect();
            // SAFETY: `names` holds that many NUL-terminated names alive for the call.
            let rc = unsafe {
                (lib.sym.daos_cont_del_attr)(
                    self.handle,
                    names.len() as c_int,
                    names.as_ptr(),
                    std::ptr::null_mut(),
                )
            };
            lib.check(rc, "deleting attributes")?;
        }
        if set.is_empty() {
            return Ok(());
        }
        let cnames: Vec<CString> = set
            .iter()
            .map(|(n, _)| c_string(n, "attribute"))
            .collect::<Result<_>>()?;
        let names: Vec<*const c_char> = cnames.iter().map(|n| n.as_ptr()).collect();
        let values: Vec<*const c_void> = set.iter().map(|(_, v)| v.as_ptr().cast()).collect();
        let sizes: Vec<usize> = set.iter().map(|(_, v)| v.len()).collect();
        // SAFETY: three arrays of `names.len()` elements: names, value pointers and value
        // sizes, all alive for the call; the values are non-empty.
        let rc = unsafe {
            (lib.sym.daos_cont_set_attr)(
                self.handle,
                names.len() as c_int,
                names.as_ptr(),
                values.as_ptr(),
                sizes.as_ptr(),
                std::ptr::null_mut(),
            )
        };
        lib.check(rc, "setting attributes")
    }

    /// Takes a snapshot; returns its epoch.
    pub fn snapshot(&self) -> Result<u64> {
        let lib = self.lib();
        let mut epoch = 0u64;
        // SAFETY: `epoch` is writable; the name must be NULL (DAOS stores none).
        let rc = unsafe {
            (lib.sym.daos_cont_create_snap_opt)(
                self.handle,
                &mut epoch,
                std::ptr::null_mut(),
                sys::SNAP_OPT_CR,
                std::ptr::null_mut(),
            )
        };
        lib.check(rc, "taking a snapshot")?;
        Ok(epoch)
    }

    /// The snapshots' epochs, oldest first.
    pub fn snapshots(&self) -> Result<Vec<u64>> {
        let lib = self.lib();
        loop {
            let mut count: c_int = 0;
            let mut anchor = sys::Anchor { bytes: [0; 15] };
            // SAFETY: a NULL epoch array with count 0 asks for the number of snapshots;
            // the anchor is a zeroed cursor, as DAOS requires one.
            let rc = unsafe {
                (lib.sym.daos_cont_list_snap)(
                    self.handle,
                    &mut count,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut anchor,
                    std::ptr::null_mut(),
                )
            };
            lib.check(rc, "listing snapshots")?;
            let room = count;
            let mut epochs = vec![0u64; room.max(0) as usize];
            let mut anchor = sys::Anchor { bytes: [0; 15] };
            // SAFETY: `epochs` has room for `count` epochs; DAOS writes at most that many
            // and says how many there are.
            let rc = unsafe {
                (lib.sym.daos_cont_list_snap)(
                    self.handle,
                    &mut count,
                    epochs.as_mut_ptr(),
                    std::ptr::null_mut(),
                    &mut anchor,
                    std::ptr::null_mut(),
                )
            };
            lib.check(rc, "listing snapshots")?;
            // A snapshot taken between the two calls: ask again.
            if count > room {
                continue;
            }
            epochs.truncate(count.max(0) as usize);
            return Ok(epochs);
        }
    }

    /// Destroys the snapshot at `epoch`.
    pub fn destroy_snapshot(&self, epoch: u64) -> Result<()> {
        let lib = self.lib();
        let range = sys::EpochRange {
            lo: epoch,
            hi: epoch,
        };
        // SAFETY: the range is passed by value; DAOS supports exactly one epoch.
        let rc =
            unsafe { (lib.sym.daos_cont_destroy_snap)(self.handle, range, std::ptr::null_mut()) };
        lib.check(rc, &format!("destroying snapshot {epoch}"))
    }
}

impl PropList {
    /// A list holding `values`: numbers in place, strings copied by DAOS.
    pub(super) fn with(lib: &'static LibDaos, values: &[(u32, PropValue)]) -> Result<PropList> {
        let n = u32::try_from(values.len())
            .map_err(|_| DaosError::Config("too many properties".into()))?;
        // SAFETY: daos_prop_alloc returns `n` zeroed entries, or NULL (too many, or no memory).
        let prop = unsafe { (lib.sym.daos_prop_alloc)(n) };
        if prop.is_null() {
            return Err(DaosError::Invalid {
                message: format!("daos_prop_alloc({n}) failed: at most 128 properties"),
                der: None,
            });
        }
        let list = PropList(prop, lib);
        for (i, (number, value)) in values.iter().enumerate() {
            // SAFETY: `i` < `n`, the number of entries DAOS allocated.
            let entry = unsafe { &mut *(*prop).dpp_entries.add(i) };
            entry.dpe_type = *number;
            match value {
                PropValue::Num(v) => entry.value.val = *v,
                PropValue::Str(s) => {
                    let text = c_string(s, "property")?;
                    // SAFETY: DAOS copies `len` bytes of the NUL-terminated text into the
                    // entry, which the list then owns.
                    let rc = unsafe {
                        (lib.sym.daos_prop_entry_set_str)(entry, text.as_ptr(), s.len() as u64)
                    };
                    lib.check(rc, "setting a string property")?;
                }
            }
        }
        Ok(list)
    }
}
