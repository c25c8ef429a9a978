//! DAOS access-control entries, `TYPE:FLAGS:PRINCIPAL:PERMS` (the format: docs/api.md,
//! "Conventions shared by the kinds"), and the add/replace/delete rules of the ACL calls
//! (docs/engine.md, "Semantics kept from DAOS").

use crate::error::{Result, der};
use dpufs_proto::daos::der::Der;

/// Whose ACL: pools and containers allow different permission letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclTarget {
    Pool,
    Container,
}

impl AclTarget {
    fn perms(self) -> &'static str {
        match self {
            AclTarget::Pool => "rwcdtTaA",
            AclTarget::Container => "rwdtTaAo",
        }
    }

    /// DAOS's default ACL for a new pool or container.
    pub fn default_acl(self) -> Vec<String> {
        let entries: &[&str] = match self {
            AclTarget::Pool => &["A::OWNER@:rw", "A:G:GROUP@:rw"],
            AclTarget::Container => &["A::OWNER@:rwdtTaAo", "A:G:GROUP@:rwtT"],
        };
        entries.iter().map(|s| s.to_string()).collect()
    }
}

/// DAOS caps an ACL at 64 KiB in its internal form.
const MAX_ACL_BYTES: usize = 64 << 10;
const MAX_PRINCIPAL_LEN: usize = 255;
const SPECIAL: [&str; 3] = ["OWNER@", "GROUP@", "EVERYONE@"];

/// The principal an entry is about, in the form DeleteACL names it:
/// `OWNER@`, `GROUP@`, `EVERYONE@`, `u:name@` or `g:name@`.
pub fn principal_key(ace: &str) -> Option<String> {
    let mut parts = ace.split(':');
    let (_, flags, principal) = (parts.next()?, parts.next()?, parts.next()?);
    Some(if SPECIAL.contains(&principal) {
        principal.to_string()
    } else if flags.contains('G') {
        format!("g:{principal}")
    } else {
        format!("u:{principal}")
    })
}

/// Checks one ACE string.
pub fn check_ace(ace: &str, target: AclTarget) -> Result<()> {
    parse_ace(ace, target).map_err(|why| der(Der::Inval, format!("invalid ACE {ace:?}: {why}")))
}

fn parse_ace(ace: &str, target: AclTarget) -> std::result::Result<(), String> {
    let parts: Vec<&str> = ace.split(':').collect();
    let [kind, flags, principal, perms] = parts[..] else {
        return Err("expected TYPE:FLAGS:PRINCIPAL:PERMS".into());
    };
    if kind != "A" {
        return Err(format!("type {kind:?} is not supported, only A (allow)"));
    }
    let group = match flags {
        "" => false,
        "G" => true,
        _ => return Err(format!("flags {flags:?}: only empty or G are allowed")),
    };
    check_principal(principal, group)?;
    if let Some(bad) = perms.chars().find(|c| !target.perms().contains(*c)) {
        return Err(format!(
            "permission {bad:?} is not one of {:?}",
            target.perms()
        ));
    }
    Ok(())
}

fn check_principal(principal: &str, group: bool) -> std::result::Result<(), String> {
    match principal {
        "GROUP@" if !group => Err("GROUP@ needs the G flag".into()),
        "OWNER@" | "EVERYONE@" if group => Err(format!("{principal} must not have the G flag")),
        p if SPECIAL.contains(&p) => Ok(()),
        p => {
            let Some((name, _domain)) = p.split_once('@') else {
                return Err(format!("principal {p:?} must look like name@"));
            };
            let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '$');
            if name.is_empty() || !name.chars().all(valid) || p.len() > MAX_PRINCIPAL_LEN {
                Err(format!("principal {p:?} is not a valid user or group name"))
            } else {
                Ok(())
            }
        }
    }
}

/// Validates a whole ACL (every entry well-formed, no principal twice, size cap) and
/// returns it in DAOS's order: the owner, named users, the owner group, named groups,
/// everyone; entries of one kind in the order given (DAOS inserts each entry after the
/// last one of its kind).
pub fn check_acl(entries: &[String], target: AclTarget) -> Result<Vec<String>> {
    let mut seen = Vec::new();
    for ace in entries {
        check_ace(ace, target)?;
        let key = principal_key(ace).unwrap_or_default();
        if seen.contains(&key) {
            return Err(der(
                Der::Inval,
                format!("principal {key} appears twice in the ACL"),
            ));
        }
        seen.push(key);
    }
    if entries.iter().map(|e| e.len() + 1).sum::<usize>() > MAX_ACL_BYTES {
        return Err(der(Der::Inval, "ACL exceeds 64 KiB"));
    }
    let mut ordered = entries.to_vec();
    ordered.sort_by_key(|ace| principal_rank(ace));
    Ok(ordered)
}

/// Where an entry's principal goes in DAOS's ACL order.
fn principal_rank(ace: &str) -> u8 {
    match principal_key(ace).as_deref() {
        Some("OWNER@") => 0,
        Some("GROUP@") => 2,
        Some("EVERYONE@") => 4,
        Some(key) if key.starts_with("g:") => 3,
        _ => 1,
    }
}

/// PoolUpdateACL semantics: each new entry replaces the one for the same
/// principal or is appended.
pub fn update_acl(current: &[String], new: &[String], target: AclTarget) -> Result<Vec<String>> {
    check_acl(new, target)?;
    let mut out = current.to_vec();
    for ace in new {
        let key = principal_key(ace);
        match out.iter_mut().find(|e| principal_key(e) == key) {
            Some(slot) => *slot = ace.clone(),
            None => out.push(ace.clone()),
        }
    }
    check_acl(&out, target)
}

/// PoolDeleteACL semantics: removes the principal's entry; DER_NONEXIST if none.
pub fn delete_from_acl(current: &[String], principal: &str) -> Result<Vec<String>> {
    let wanted = normalize_principal(principal)?;
    let before = current.len();
    let out: Vec<String> = current
        .iter()
        .filter(|e| principal_key(e).as_deref() != Some(wanted.as_str()))
        .cloned()
        .collect();
    if out.len() == before {
        return Err(der(Der::Nonexist, format!("no ACL entry for {principal}")));
    }
    Ok(out)
}

fn normalize_principal(p: &str) -> Result<String> {
    let ok = SPECIAL.contains(&p)
        || p.strip_prefix("u:")
            .or_else(|| p.strip_prefix("g:"))
            .is_some_and(|name| check_principal(name, p.starts_with("g:")).is_ok());
    if ok {
        Ok(p.to_string())
    } else {
        Err(der(
            Der::Inval,
            format!("principal {p:?}: use OWNER@, GROUP@, EVERYONE@, u:name@ or g:name@"),
        ))
    }
}

/// Checks an owner principal (`name@`) given to create or set-owner.
pub fn check_owner(p: &str, group: bool) -> Result<()> {
    if SPECIAL.contains(&p) {
        return Err(der(Der::Inval, format!("{p} cannot own anything")));
    }
    check_principal(p, group).map_err(|why| der(Der::Inval, why))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn accepts_daos_examples() {
        for ace in [
            "A::OWNER@:rw",
            "A:G:GROUP@:rw",
            "A::EVERYONE@:",
            "A::bob@:rwcdtTaA",
            "A:G:ml-team@:r",
        ] {
            check_ace(ace, AclTarget::Pool).unwrap();
        }
        check_ace("A::OWNER@:rwdtTaAo", AclTarget::Container).unwrap();
        check_acl(&AclTarget::Pool.default_acl(), AclTarget::Pool).unwrap();
        check_acl(&AclTarget::Container.default_acl(), AclTarget::Container).unwrap();
    }

    #[test]
    fn rejects_malformed_entries() {
        for ace in [
            "",
            "A::OWNER@",
            "D::OWNER@:rw",
            "A:X:OWNER@:rw",
            "A::GROUP@:rw",
            "A:G:OWNER@:r",
            "A::bob:rw",
            "A::@:rw",
            "A::bob@:rwz",
            "A::bo b@:r",
        ] {
            assert!(check_ace(ace, AclTarget::Pool).is_err(), "{ace:?} accepted");
        }
        assert!(check_ace("A::OWNER@:o", AclTarget::Pool).is_err());
        assert!(check_ace("A::OWNER@:c", AclTarget::Container).is_err());
        assert!(check_acl(&s(&["A::bob@:r", "A::bob@:w"]), AclTarget::Pool).is_err());
    }

    #[test]
    fn update_replaces_per_principal() {
        let acl = s(&["A::OWNER@:rw", "A:G:GROUP@:rw"]);
        let out = update_acl(&acl, &s(&["A::OWNER@:r", "A::bob@:rw"]), AclTarget::Pool).unwrap();
        // A named user goes between the owner and the owner group, as in DAOS.
        assert_eq!(out, s(&["A::OWNER@:r", "A::bob@:rw", "A:G:GROUP@:rw"]));
        // A user and a group of the same name are different principals.
        let out = update_acl(&out, &s(&["A:G:bob@:r"]), AclTarget::Pool).unwrap();
        assert_eq!(out.len(), 4);
    }

    #[test]
    fn acls_come_back_in_daos_order() {
        let given = s(&[
            "A::EVERYONE@:r",
            "A:G:ops@:rw",
            "A::zed@:r",
            "A:G:GROUP@:rw",
            "A::amy@:r",
            "A::OWNER@:rw",
        ]);
        assert_eq!(
            check_acl(&given, AclTarget::Pool).unwrap(),
            s(&[
                "A::OWNER@:rw",
                "A::zed@:r",
                "A::amy@:r",
                "A:G:GROUP@:rw",
                "A:G:ops@:rw",
                "A::EVERYONE@:r",
            ])
        );
    }

    #[test]
    fn delete_names_principals_like_dmg() {
        let acl = s(&["A::OWNER@:rw", "A::bob@:rw", "A:G:bob@:r"]);
        assert_eq!(
            delete_from_acl(&acl, "g:bob@").unwrap(),
            s(&["A::OWNER@:rw", "A::bob@:rw"])
        );
        assert_eq!(delete_from_acl(&acl, "OWNER@").unwrap().len(), 2);
        assert!(delete_from_acl(&acl, "u:carol@").is_err());
        assert!(delete_from_acl(&acl, "bob@").is_err());
    }
}
