//! Generates a DAOS certificate set for development clusters and tests, laid
//! out as DAOS expects (`utils/certs/gen_certificates.sh`): a CA and one
//! certificate per component type — `admin`, `agent`, `server` — with the
//! component as CN, O=DAOS, and the key usages DAOS checks.

use crate::tls::max_key_mode;
use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use openssl::rsa::Rsa;
use openssl::x509::extension::{BasicConstraints, ExtendedKeyUsage, KeyUsage};
use openssl::x509::{X509, X509Builder, X509Name, X509NameBuilder, X509NameRef};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// DAOS's CA key size (RSA 3072).
const CA_BITS: u32 = 3072;
const CERT_BITS: u32 = 3072;
const VALID_DAYS: u32 = 3650;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A CA that can issue component certificates.
#[derive(Debug)]
pub struct CertAuthority {
    pub cert: X509,
    key: PKey<Private>,
}

fn name(cn: &str) -> Result<X509Name> {
    let mut n = X509NameBuilder::new()?;
    n.append_entry_by_text("O", "DAOS")?;
    n.append_entry_by_text("CN", cn)?;
    Ok(n.build())
}

fn serial() -> Result<openssl::asn1::Asn1Integer> {
    let mut bn = BigNum::new()?;
    bn.rand(128, MsbOption::MAYBE_ZERO, false)?;
    Ok(bn.to_asn1_integer()?)
}

/// A certificate builder with the fields every DAOS certificate shares.
fn builder(
    subject: &X509NameRef,
    issuer: &X509NameRef,
    key: &PKey<Private>,
) -> Result<X509Builder> {
    let serial = serial()?;
    let (not_before, not_after) = (
        Asn1Time::days_from_now(0)?,
        Asn1Time::days_from_now(VALID_DAYS)?,
    );
    let mut b = X509::builder()?;
    b.set_version(2)?;
    b.set_serial_number(&serial)?;
    b.set_subject_name(subject)?;
    b.set_issuer_name(issuer)?;
    b.set_pubkey(key)?;
    b.set_not_before(&not_before)?;
    b.set_not_after(&not_after)?;
    Ok(b)
}

impl CertAuthority {
    /// A new self-signed CA (RSA 3072, SHA-512).
    pub fn new(cn: &str) -> Result<CertAuthority> {
        let key = PKey::from_rsa(Rsa::generate(CA_BITS)?)?;
        let subject = name(cn)?;
        let mut b = builder(&subject, &subject, &key)?;
        b.append_extension(BasicConstraints::new().critical().ca().build()?)?;
        b.append_extension(
            KeyUsage::new()
                .critical()
                .key_cert_sign()
                .crl_sign()
                .build()?,
        )?;
        b.sign(&key, MessageDigest::sha512())?;
        Ok(CertAuthority {
            cert: b.build(),
            key,
        })
    }

    /// Issues a certificate for `component` (its CN); servers get serverAuth
    /// and clientAuth, everything else clientAuth.
    pub fn issue(&self, component: &str) -> Result<(X509, PKey<Private>)> {
        self.issue_for(component, component == "server")
    }

    /// Issues a certificate with any CN, for server use or not.
    pub fn issue_for(&self, cn: &str, server: bool) -> Result<(X509, PKey<Private>)> {
        let key = PKey::from_rsa(Rsa::generate(CERT_BITS)?)?;
        let subject = name(cn)?;
        let mut b = builder(&subject, self.cert.subject_name(), &key)?;
        b.append_extension(
            KeyUsage::new()
                .critical()
                .digital_signature()
                .key_encipherment()
                .build()?,
        )?;
        let mut eku = ExtendedKeyUsage::new();
        eku.client_auth();
        if server {
            eku.server_auth();
        }
        b.append_extension(eku.build()?)?;
        b.sign(&self.key, MessageDigest::sha512())?;
        Ok((b.build(), key))
    }

    /// Writes `DIR/daosCA.crt` (and the CA key, for issuing more later).
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_file(&dir.join("daosCA.crt"), &self.cert.to_pem()?, 0o644)?;
        write_file(
            &dir.join("daosCA.key"),
            &self.key.private_key_to_pem_pkcs8()?,
            0o400,
        )
    }

    /// Issues `component` and writes `DIR/<component>.crt` and `.key` with the
    /// permissions DAOS requires.
    pub fn write_component(&self, dir: &Path, component: &str) -> Result<()> {
        let (cert, key) = self.issue(component)?;
        write_pair(dir, component, &cert, &key)
    }
}

/// Writes `DIR/<component>.crt` and `.key` with the permissions DAOS requires.
pub fn write_pair(dir: &Path, component: &str, cert: &X509, key: &PKey<Private>) -> Result<()> {
    write_file(
        &dir.join(format!("{component}.crt")),
        &cert.to_pem()?,
        0o644,
    )?;
    write_file(
        &dir.join(format!("{component}.key")),
        &key.private_key_to_pem_pkcs8()?,
        max_key_mode(component),
    )
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    if path.exists() {
        // Keys are read-only; make them writable to replace them.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::write(path, bytes)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Generates a complete set in `dir`: CA, admin, agent and server
/// certificates, and `clients/agent.crt` for the server to verify agents.
pub fn generate(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("clients"))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))?;
    let ca = CertAuthority::new("DAOS CA")?;
    ca.write(dir)?;
    for component in ["admin", "agent", "server"] {
        ca.write_component(dir, component)?;
    }
    std::fs::copy(dir.join("agent.crt"), dir.join("clients").join("agent.crt"))?;
    Ok(())
}
