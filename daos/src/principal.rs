//! DAOS principals of the calling process, as dmg fills in a new pool's owner: the
//! effective user's name and its primary group's name. A pool created with empty owner
//! fields belongs to `NOBODY@`, which the default ACL leaves usable by no one
//! (docs/daos-wire-versions.md, section 3).

use crate::error::{DaosError, Result};
use std::ffi::CStr;

/// `name` as a DAOS principal: `name@`, unless it names its domain already.
pub fn principal(name: &str) -> String {
    if name.contains('@') {
        name.to_string()
    } else {
        format!("{name}@")
    }
}

/// The principals of the effective user and group: `(user@, group@)`.
pub fn caller() -> Result<(String, String)> {
    // SAFETY: geteuid and getegid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let user = user_name(uid).ok_or_else(|| nameless("user", uid))?;
    let group = group_name(gid).ok_or_else(|| nameless("group", gid))?;
    Ok((principal(&user), principal(&group)))
}

fn nameless(what: &str, id: u32) -> DaosError {
    DaosError::Config(format!(
        "the {what} id {id} of this process has no name, so a new pool would belong to \
         NOBODY@: name its owner and group explicitly"
    ))
}

/// Room for the strings of a passwd or group entry; grown when the system needs more.
const FIRST_BUFFER: usize = 1024;
const LAST_BUFFER: usize = 1 << 20;

fn user_name(uid: libc::uid_t) -> Option<String> {
    name_of(|buf| {
        // SAFETY: an all-zero passwd is a valid value of a plain C struct.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call and `buf.len()` is the buffer's size.
        let rc =
            unsafe { libc::getpwuid_r(uid, &mut entry, buf.as_mut_ptr(), buf.len(), &mut found) };
        (
            rc,
            if found.is_null() {
                std::ptr::null()
            } else {
                entry.pw_name
            },
        )
    })
}

fn group_name(gid: libc::gid_t) -> Option<String> {
    name_of(|buf| {
        // SAFETY: an all-zero group is a valid value of a plain C struct.
        let mut entry: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: as in `user_name`.
        let rc =
            unsafe { libc::getgrgid_r(gid, &mut entry, buf.as_mut_ptr(), buf.len(), &mut found) };
        (
            rc,
            if found.is_null() {
                std::ptr::null()
            } else {
                entry.gr_name
            },
        )
    })
}

/// Runs a reentrant lookup (`getpwuid_r`-like: it returns an errno and the found name,
/// whose bytes lie in the buffer it is given) with a buffer grown until it fits.
fn name_of(
    lookup: impl Fn(&mut [libc::c_char]) -> (libc::c_int, *const libc::c_char),
) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; FIRST_BUFFER];
    loop {
        let (rc, name) = lookup(&mut buf);
        if rc == libc::ERANGE && buf.len() < LAST_BUFFER {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || name.is_null() {
            return None;
        }
        // SAFETY: the lookup succeeded, so `name` is a NUL-terminated string in `buf`,
        // which is alive and unchanged here.
        return Some(
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_get_an_at_sign_once() {
        assert_eq!(principal("alice"), "alice@");
        assert_eq!(principal("alice@"), "alice@");
        assert_eq!(principal("alice@example"), "alice@example");
    }

    /// The names come from the system's databases: compared with what `id` says.
    #[test]
    fn the_caller_is_the_effective_user_and_group() {
        let id = |flag: &str| {
            let out = std::process::Command::new("id")
                .arg(flag)
                .output()
                .expect("id");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        let (user, group) = caller().expect("this process has names");
        assert_eq!(user, format!("{}@", id("-un")));
        assert_eq!(group, format!("{}@", id("-gn")));
        // SAFETY: as in `caller`.
        assert_eq!(user_name(unsafe { libc::geteuid() }).unwrap(), id("-un"));
        assert_eq!(user_name(4_000_000_000), None, "no such user");
    }
}
