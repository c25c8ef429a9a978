//! `dpufs certs dpu DIR --agent-host NAME|IP...`: the certificates of the control channel
//! between a host's CSI node shim and the dpufs agent on its DPU (docs/dpu.md, "Control
//! channel"): a CA of its own, the agent's server pair with the names and addresses hosts dial
//! as subject alternative names, and the hosts' client pair. Both pairs are signed by the one
//! CA, and each side trusts only it: a client without a certificate of this CA is refused.
//!
//! The CA is separate from the DAOS CA on purpose: a certificate of one never opens the other.
//! For the same reason the builder here is not `dpufs_daos::certs`'s: that one makes DAOS's set
//! with DAOS's conventions (RSA 3072, SHA-512, O=DAOS, DAOS's file names and modes) inside the
//! DAOS client crate; this channel is dpufs's own (P-256, subject alternative names), and the
//! fields the two share (serial, validity, names) are a few openssl calls each.

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
};
use openssl::x509::{X509, X509Builder, X509NameBuilder};
use std::net::IpAddr;
use std::path::Path;

/// The files `dpufs certs dpu` writes, as the agent's and the shim's `--tls-*` flags name them.
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const AGENT_CERT: &str = "agent.crt";
pub const AGENT_KEY: &str = "agent.key";
pub const HOST_CERT: &str = "host.crt";
pub const HOST_KEY: &str = "host.key";

/// The subjects' common names (for people reading certificates; names are checked through the
/// subject alternative names, and the hosts' certificate is recognised by its CA).
const CA_CN: &str = "dpufs DPU control channel CA";
const AGENT_CN: &str = "dpufs-dpu-agent";
const HOST_CN: &str = "dpufs-host";

const VALID_DAYS: u32 = 3650;

#[derive(Debug, clap::Args)]
pub struct DpuArgs {
    /// Target directory (created; existing files are replaced).
    dir: std::path::PathBuf,
    /// A name or address hosts dial the agent by (repeat it, or separate with commas): a DNS
    /// name or an IP address, written into the agent's certificate. Shims check it.
    #[arg(long = "agent-host", value_delimiter = ',', required = true)]
    agent_hosts: Vec<String>,
}

/// One subject alternative name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum AltName {
    Dns(String),
    Ip(IpAddr),
}

impl AltName {
    pub(super) fn parse(raw: &str) -> anyhow::Result<AltName> {
        if let Ok(ip) = raw.parse::<IpAddr>() {
            return Ok(AltName::Ip(ip));
        }
        let valid = !raw.is_empty()
            && raw.len() <= 253
            && raw.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            });
        anyhow::ensure!(
            valid,
            "--agent-host {raw:?} is neither an IP address nor a DNS name"
        );
        Ok(AltName::Dns(raw.to_ascii_lowercase()))
    }
}

type SslResult<T> = Result<T, openssl::error::ErrorStack>;

/// A P-256 key: fast to make, and what every TLS stack takes.
fn new_key() -> SslResult<PKey<Private>> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    PKey::from_ec_key(EcKey::generate(&group)?)
}

fn builder(cn: &str, key: &PKey<Private>, issuer: Option<&X509>) -> SslResult<X509Builder> {
    let mut name = X509NameBuilder::new()?;
    name.append_entry_by_text("O", "dpufs")?;
    name.append_entry_by_text("CN", cn)?;
    let name = name.build();
    let mut serial = BigNum::new()?;
    serial.rand(127, MsbOption::MAYBE_ZERO, false)?;
    let mut b = X509::builder()?;
    b.set_version(2)?;
    let serial = serial.to_asn1_integer()?;
    b.set_serial_number(&serial)?;
    b.set_subject_name(&name)?;
    b.set_issuer_name(issuer.map_or(&name, |ca| ca.subject_name()))?;
    b.set_pubkey(key)?;
    let (not_before, not_after) = (
        Asn1Time::days_from_now(0)?,
        Asn1Time::days_from_now(VALID_DAYS)?,
    );
    b.set_not_before(&not_before)?;
    b.set_not_after(&not_after)?;
    Ok(b)
}

/// The CA, the agent's pair for `names` and the hosts' pair.
pub(super) struct Set {
    ca: (X509, PKey<Private>),
    agent: (X509, PKey<Private>),
    host: (X509, PKey<Private>),
}

pub(super) fn issue(names: &[AltName]) -> SslResult<Set> {
    let ca_key = new_key()?;
    let mut b = builder(CA_CN, &ca_key, None)?;
    b.append_extension(BasicConstraints::new().critical().ca().pathlen(0).build()?)?;
    b.append_extension(
        KeyUsage::new()
            .critical()
            .key_cert_sign()
            .crl_sign()
            .build()?,
    )?;
    b.sign(&ca_key, MessageDigest::sha256())?;
    let ca = b.build();
    let leaf = |cn: &str, server: bool| -> SslResult<(X509, PKey<Private>)> {
        let key = new_key()?;
        let mut b = builder(cn, &key, Some(&ca))?;
        b.append_extension(BasicConstraints::new().critical().build()?)?;
        b.append_extension(KeyUsage::new().critical().digital_signature().build()?)?;
        let mut eku = ExtendedKeyUsage::new();
        if server {
            eku.server_auth();
            let mut san = SubjectAlternativeName::new();
            for n in names {
                match n {
                    AltName::Dns(d) => san.dns(d),
                    AltName::Ip(ip) => san.ip(&ip.to_string()),
                };
            }
            b.append_extension(san.build(&b.x509v3_context(Some(&ca), None))?)?;
        } else {
            eku.client_auth();
        }
        b.append_extension(eku.build()?)?;
        b.sign(&ca_key, MessageDigest::sha256())?;
        Ok((b.build(), key))
    };
    Ok(Set {
        agent: leaf(AGENT_CN, true)?,
        host: leaf(HOST_CN, false)?,
        ca: (ca, ca_key),
    })
}

/// Writes the set: certificates 0644, keys 0600.
pub(super) fn write(dir: &Path, set: &Set) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let pairs = [
        (CA_CERT, CA_KEY, &set.ca),
        (AGENT_CERT, AGENT_KEY, &set.agent),
        (HOST_CERT, HOST_KEY, &set.host),
    ];
    for (cert_file, key_file, (cert, key)) in pairs {
        dpufs_node_api::file::write_atomic(
            &dir.join(key_file),
            &key.private_key_to_pem_pkcs8()?,
            0o600,
        )?;
        dpufs_node_api::file::write_atomic(&dir.join(cert_file), &cert.to_pem()?, 0o644)?;
    }
    Ok(())
}

pub fn run(args: DpuArgs, out: crate::output::Out) -> anyhow::Result<()> {
    let names = args
        .agent_hosts
        .iter()
        .map(|h| AltName::parse(h.trim()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let set = issue(&names)?;
    write(&args.dir, &set)
        .map_err(|e| anyhow::anyhow!("writing certificates to {}: {e}", args.dir.display()))?;
    let dir = &args.dir;
    out.show(
        &serde_json::json!({ "dir": dir, "agentNames": names }),
        |_| {
            println!("DPU control channel certificates written to {}:", dir.display());
            println!("  {CA_CERT} {CA_KEY}         the CA (keep the key offline; both sides trust {CA_CERT})");
            println!("  {AGENT_CERT} {AGENT_KEY}   dpufs-csi dpu-agent --tls-cert/--tls-key (names: {})", args.agent_hosts.join(", "));
            println!("  {HOST_CERT} {HOST_KEY}     dpufs-csi node --mode dpu-host --tls-cert/--tls-key");
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use openssl::x509::store::X509StoreBuilder;
    use openssl::x509::{X509StoreContext, X509VerifyResult};
    use std::os::unix::fs::PermissionsExt;

    fn verifies(ca: &X509, cert: &X509) -> X509VerifyResult {
        let mut store = X509StoreBuilder::new().unwrap();
        store.add_cert(ca.clone()).unwrap();
        let store = store.build();
        let chain = openssl::stack::Stack::new().unwrap();
        let mut ctx = X509StoreContext::new().unwrap();
        ctx.init(&store, cert, &chain, |c| {
            c.verify_cert()?;
            Ok(c.error())
        })
        .unwrap()
    }

    #[test]
    fn names_are_ip_addresses_or_dns_names() {
        assert_eq!(
            AltName::parse("10.0.2.2").unwrap(),
            AltName::Ip("10.0.2.2".parse().unwrap())
        );
        assert_eq!(
            AltName::parse("fd00::1").unwrap(),
            AltName::Ip("fd00::1".parse().unwrap())
        );
        assert_eq!(
            AltName::parse("DPU-1.cluster.local").unwrap(),
            AltName::Dns("dpu-1.cluster.local".into())
        );
        for bad in ["", "a b", "-x", "x..y", "x/y", &"a".repeat(64)] {
            assert!(AltName::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_set_chains_to_its_ca_with_the_names_and_modes_asked() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            AltName::Ip("127.0.0.1".parse().unwrap()),
            AltName::Dns("dpu-1".into()),
        ];
        write(dir.path(), &issue(&names).unwrap()).unwrap();
        let read = |f: &str| X509::from_pem(&std::fs::read(dir.path().join(f)).unwrap()).unwrap();
        let (ca, agent, host) = (read(CA_CERT), read(AGENT_CERT), read(HOST_CERT));
        assert_eq!(verifies(&ca, &agent), X509VerifyResult::OK);
        assert_eq!(verifies(&ca, &host), X509VerifyResult::OK);
        let sans: Vec<String> = agent
            .subject_alt_names()
            .unwrap()
            .iter()
            .map(|n| match (n.dnsname(), n.ipaddress()) {
                (Some(d), _) => d.to_string(),
                (None, Some(ip)) => format!("{ip:?}"),
                _ => panic!("an unexpected name"),
            })
            .collect();
        assert_eq!(sans, ["[127, 0, 0, 1]", "dpu-1"]);
        assert!(host.subject_alt_names().is_none());
        // Another run makes another CA: its certificates do not chain to this one.
        let other = tempfile::tempdir().unwrap();
        write(other.path(), &issue(&names).unwrap()).unwrap();
        let foreign =
            X509::from_pem(&std::fs::read(other.path().join(HOST_CERT)).unwrap()).unwrap();
        assert_ne!(verifies(&ca, &foreign), X509VerifyResult::OK);
        let mode = |f: &str| {
            std::fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        for key in [CA_KEY, AGENT_KEY, HOST_KEY] {
            assert_eq!(mode(key), 0o600, "{key}");
        }
        for cert in [CA_CERT, AGENT_CERT, HOST_CERT] {
            assert_eq!(mode(cert), 0o644, "{cert}");
        }
    }
}
