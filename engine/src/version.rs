//! Who may call and with which version: DAOS's system-name check and its
//! component version rules (docs/engine.md, "Semantics kept from DAOS").

use crate::error::{EngineError, Result, fault};
use dpufs_proto::daos::fault::FaultCode;
use dpufs_proto::daos::{COMPONENT_HEADER, VERSION_HEADER, WIRE_VERSION};
use tonic::metadata::MetadataMap;

/// A `major.minor.patch` version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Semver {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Semver {
    /// Parses `2.8.0` (a trailing pre-release or build suffix is ignored).
    pub fn parse(s: &str) -> Option<Semver> {
        let core = s.split(['-', '+']).next()?;
        let mut it = core.split('.').map(|p| p.parse::<u32>());
        let v = Semver {
            major: it.next()?.ok()?,
            minor: it.next()?.ok()?,
            patch: it.next().unwrap_or(Ok(0)).ok()?,
        };
        it.next().is_none().then_some(v)
    }
}

impl std::fmt::Display for Semver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The version this engine reports: the DAOS release whose wire it speaks.
pub fn server_version() -> Semver {
    Semver::parse(WIRE_VERSION).expect("WIRE_VERSION is a version")
}

/// Splits `daos_server-2.8.0` into the system name and the optional version.
fn split_sys(sys: &str) -> (&str, Option<Semver>) {
    match sys.rsplit_once('-') {
        Some((name, ver)) => match Semver::parse(ver) {
            Some(v) => (name, Some(v)),
            None => (sys, None),
        },
        None => (sys, None),
    }
}

/// What the caller told us about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// `admin`, `agent` or `server`; None when no headers were sent.
    pub component: Option<String>,
}

/// Checks a request's system name and the caller's version. `peer_cn` is the
/// client certificate's CN in secure mode; the header must then match it.
pub fn check_caller(
    meta: &MetadataMap,
    sys: &str,
    system: &str,
    peer_cn: Option<&str>,
) -> Result<Caller> {
    let (name, sys_version) = split_sys(sys);
    if !name.is_empty() && name != system {
        return Err(fault(
            FaultCode::WrongSystem,
            format!("request was for system {name:?}, but this is system {system:?}"),
        ));
    }
    let header = |key: &str| {
        meta.get(key)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let component = header(COMPONENT_HEADER);
    if let (Some(cn), Some(comp)) = (peer_cn, component.as_deref())
        && cn != comp
    {
        return Err(EngineError::PermissionDenied(format!(
            "component mismatch: header says {comp:?}, certificate says {cn:?}"
        )));
    }
    let server = server_version();
    match (component.as_deref(), header(VERSION_HEADER)) {
        (Some(comp), Some(ver)) => {
            let theirs = Semver::parse(&ver).unwrap_or(Semver {
                major: 0,
                minor: 0,
                patch: 0,
            });
            if !compatible(comp, theirs, server) {
                return Err(incompatible(comp, theirs, server));
            }
        }
        _ => match (sys_version, peer_cn.is_some()) {
            (Some(v), true) if compatible("admin", v, server) => {}
            (Some(v), false) if v == server => {}
            (v, secure) => {
                let theirs = v.unwrap_or(Semver {
                    major: 0,
                    minor: 0,
                    patch: 0,
                });
                return Err(if secure {
                    incompatible("admin", theirs, server)
                } else {
                    fault(
                        FaultCode::NoCompatibilityInsecure,
                        format!(
                            "insecure mode without version headers needs exactly version {server}, caller has {theirs}; send {COMPONENT_HEADER} and {VERSION_HEADER}"
                        ),
                    )
                });
            }
        },
    }
    Ok(Caller { component })
}

/// DAOS's interop rules: nothing below 2.0; agents within two minor versions
/// of the server; everything else on the same major.minor.
fn compatible(component: &str, theirs: Semver, server: Semver) -> bool {
    if theirs.major < 2 || theirs.major != server.major {
        return false;
    }
    match component {
        "agent" => theirs.minor.abs_diff(server.minor) <= 2,
        _ => theirs.minor == server.minor,
    }
}

fn incompatible(component: &str, theirs: Semver, server: Semver) -> EngineError {
    fault(
        FaultCode::IncompatibleComponents,
        format!("{component} version {theirs} is incompatible with server version {server}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(component: &str, version: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(COMPONENT_HEADER, component.parse().unwrap());
        m.insert(VERSION_HEADER, version.parse().unwrap());
        m
    }

    fn fault_code(e: EngineError) -> FaultCode {
        match e {
            EngineError::Fault { code, .. } => code,
            other => panic!("expected a fault, got {other:?}"),
        }
    }

    #[test]
    fn admin_needs_same_minor() {
        assert!(check_caller(&meta("admin", "2.8.3"), "daos_server", "daos_server", None).is_ok());
        let e = check_caller(&meta("admin", "2.6.5"), "", "daos_server", None).unwrap_err();
        assert_eq!(fault_code(e), FaultCode::IncompatibleComponents);
        let e = check_caller(&meta("admin", "1.8.0"), "", "daos_server", None).unwrap_err();
        assert_eq!(fault_code(e), FaultCode::IncompatibleComponents);
    }

    #[test]
    fn agents_may_lag_two_minors() {
        assert!(check_caller(&meta("agent", "2.6.0"), "", "daos_server", None).is_ok());
        assert!(check_caller(&meta("agent", "2.5.0"), "", "daos_server", None).is_err());
    }

    #[test]
    fn system_name_must_match() {
        let e =
            check_caller(&meta("admin", "2.8.0"), "other-2.8.0", "daos_server", None).unwrap_err();
        assert_eq!(fault_code(e), FaultCode::WrongSystem);
        assert!(
            check_caller(
                &meta("admin", "2.8.0"),
                "daos_server-2.8.0",
                "daos_server",
                None
            )
            .is_ok()
        );
    }

    #[test]
    fn without_headers_the_sys_suffix_decides() {
        let none = MetadataMap::new();
        assert!(check_caller(&none, "daos_server-2.8.0", "daos_server", None).is_ok());
        let e = check_caller(&none, "daos_server-2.8.1", "daos_server", None).unwrap_err();
        assert_eq!(fault_code(e), FaultCode::NoCompatibilityInsecure);
        let e = check_caller(&none, "daos_server", "daos_server", None).unwrap_err();
        assert_eq!(fault_code(e), FaultCode::NoCompatibilityInsecure);
        let e = check_caller(&none, "daos_server", "daos_server", Some("admin")).unwrap_err();
        assert_eq!(fault_code(e), FaultCode::IncompatibleComponents);
    }

    #[test]
    fn header_must_match_certificate() {
        let e =
            check_caller(&meta("admin", "2.8.0"), "", "daos_server", Some("agent")).unwrap_err();
        assert!(matches!(e, EngineError::PermissionDenied(_)));
    }
}
