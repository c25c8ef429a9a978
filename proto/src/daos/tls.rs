//! DAOS's rules for its mutual TLS (DAOS v2.8.0 `security/`): the one cipher suite, the CN a
//! server presents, and how open a certificate or key file may be. The client (dpufs-daos) and
//! the embedded engine's server both follow them from here.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The one cipher suite DAOS accepts (`TLS_RSA_WITH_AES_256_GCM_SHA384`), in OpenSSL's naming.
pub const CIPHER: &str = "AES256-GCM-SHA384";

/// Common Name DAOS servers present.
pub const SERVER_CN: &str = "server";

/// Largest permissions DAOS tolerates on a component's key file (`security/pem.go`): the admin
/// key may be group-readable, every other key only owner-readable.
pub fn max_key_mode(component: &str) -> u32 {
    if component == "admin" { 0o440 } else { 0o400 }
}

/// Largest permissions DAOS tolerates on certificate files.
pub const MAX_CERT_MODE: u32 = 0o664;

/// Refuses a file whose permissions are wider than `max`, saying how to fix it.
pub fn check_mode(path: &Path, max: u32) -> std::io::Result<()> {
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
    if mode & !max != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} has mode {mode:o}, at most {max:o} is allowed (chmod {max:o} it)",
                path.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_wider_than_daos_allows_are_refused() {
        let dir = std::env::temp_dir().join(format!("dpufs-proto-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("agent.key");
        std::fs::write(&key, "k").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        check_mode(&key, max_key_mode("agent")).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o440)).unwrap();
        let err = check_mode(&key, max_key_mode("agent")).unwrap_err();
        assert!(err.to_string().contains("chmod 400"), "{err}");
        check_mode(&key, max_key_mode("admin")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
