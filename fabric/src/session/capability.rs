//! Connection capabilities (docs/fabric.md, "Capabilities"): what a tenant worker may do on
//! an engine, signed by the node agent's Ed25519 key and checked by the server before it
//! creates a QP or moves a byte.
//!
//! Why a signature and not a shared secret: the engine trusts node agents, not workers. A
//! worker only holds a token the agent minted for its (tenant, volume); it cannot widen it, and
//! a token leaked from one worker expires on its own.
//!
//! Why a holder key: the token crosses the node's network in the clear, in the handshake. The
//! agent binds each token to a key pair it makes for it (`holder`, the public half, in the
//! claims) and hands the private half to the worker with the token; the worker proves it holds
//! it by signing the server's fresh challenge at each handshake (see `super::handshake`). A
//! token captured on the wire is useless without it.
//!
//! # Format (version 2, all integers little endian)
//!
//! - Claims, deterministic: `2u8`; `tenant`, `volume`, `pool`, `container`, each a `u16`
//!   length and UTF-8; `rights: u8` (bit 0 read, bit 1 write); `not_after: u64` (unix seconds);
//!   `nonce: [u8; 16]`; `holder: [u8; 32]` (raw Ed25519 public key).
//! - Signed message: `"dpufs-capability-v1\0"`, the key id (a `u16` length and ASCII), the
//!   claims; so a signature cannot be moved to another key id.
//! - Signed capability: the key id (`u16` length), the claims (`u32` length), the signature
//!   (`u16` length).
//! - Key id: hex of the first 8 bytes of SHA-256 of the raw Ed25519 public key.
//! - Hex form (command lines, the worker's capability file): hex of the wire form, then `:` and
//!   hex of the holder's 32-byte private key where the token carries it.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::agent::HolderKey;

const CLAIMS_VERSION: u8 = 2;
/// Longest name field (tenant, volume, pool, container).
pub const MAX_NAME_LEN: usize = 1024;

/// Why a capability could not be made, read or accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    /// The bytes are not a capability of this version.
    #[error("malformed capability: {0}")]
    Malformed(String),
    /// Signed by a key the server does not trust.
    #[error(
        "capability signed by unknown agent key {key_id:?}; add the node agent's public key \
         to the server's trusted agents"
    )]
    UnknownKey {
        /// Key id named by the capability.
        key_id: String,
    },
    /// The signature does not verify: forged or altered.
    #[error("capability signature does not verify for agent key {key_id:?} (forged or altered)")]
    BadSignature {
        /// Key id named by the capability.
        key_id: String,
    },
    /// Past its expiry.
    #[error(
        "capability expired at unix time {not_after} (server time {now}, allowed skew \
         {skew_secs} s); ask the node agent for a fresh one"
    )]
    Expired {
        /// Expiry.
        not_after: u64,
        /// Server clock.
        now: u64,
        /// Allowed clock skew.
        skew_secs: u64,
    },
    /// Valid for longer than the server accepts: a token that lives for days would make a
    /// leaked one useful for days.
    #[error(
        "capability valid until unix time {not_after}, {} s from now (server time {now}): \
         this server accepts at most {max_secs} s; have the node agent sign shorter ones \
         (--capability-ttl-secs)",
        not_after.saturating_sub(*now)
    )]
    TooLong {
        /// Expiry.
        not_after: u64,
        /// Server clock.
        now: u64,
        /// The longest lifetime accepted, the allowed clock skew included.
        max_secs: u64,
    },
    /// OpenSSL failed.
    #[error("crypto: {0}")]
    Crypto(String),
    /// Reading or writing a key file failed.
    #[error("{0}")]
    Io(String),
}

/// Rights on the volume's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Rights {
    /// May read (the server pushes data into the worker's read-landing buffers).
    pub read: bool,
    /// May write (the server pulls data from the worker's write-staging buffers).
    pub write: bool,
}

impl Rights {
    /// Read and write.
    pub const READ_WRITE: Rights = Rights {
        read: true,
        write: true,
    };
    /// Read only.
    pub const READ_ONLY: Rights = Rights {
        read: true,
        write: false,
    };

    fn bits(self) -> u8 {
        u8::from(self.read) | (u8::from(self.write) << 1)
    }
}

/// The claims of a capability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    /// Tenant principal.
    pub tenant: String,
    /// Volume (CSI volume id) the worker serves.
    pub volume: String,
    /// DAOS pool.
    pub pool: String,
    /// DAOS container.
    pub container: String,
    /// Data rights.
    pub rights: Rights,
    /// Expiry, unix seconds.
    pub not_after: u64,
    /// Random, makes every token distinct (audit logs, revocation lists).
    pub nonce: [u8; 16],
    /// Raw Ed25519 public key of the one key pair that may present the token; set by
    /// [`super::AgentKey::sign`], zeros before.
    pub holder: [u8; 32],
}

/// Seconds since the unix epoch now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Capability {
    /// Refuses claims valid for more than `max` from `now` (unix seconds), allowing `skew`
    /// for a signer whose clock runs ahead.
    pub fn check_lifetime(
        &self,
        now: u64,
        max: Duration,
        skew: Duration,
    ) -> Result<(), CapabilityError> {
        let max_secs = max.as_secs().saturating_add(skew.as_secs());
        if self.not_after > now.saturating_add(max_secs) {
            return Err(CapabilityError::TooLong {
                not_after: self.not_after,
                now,
                max_secs,
            });
        }
        Ok(())
    }

    /// Whether the claims have expired at `now` (unix seconds), allowing `skew`.
    pub fn expired_at(&self, now: u64, skew: Duration) -> bool {
        now > self.not_after.saturating_add(skew.as_secs())
    }

    /// Claims valid for `ttl` from now, with a fresh random nonce.
    pub fn new(
        tenant: impl Into<String>,
        volume: impl Into<String>,
        pool: impl Into<String>,
        container: impl Into<String>,
        rights: Rights,
        ttl: Duration,
    ) -> Capability {
        Capability {
            tenant: tenant.into(),
            volume: volume.into(),
            pool: pool.into(),
            container: container.into(),
            rights,
            not_after: unix_now().saturating_add(ttl.as_secs()),
            nonce: rand::random(),
            holder: [0; 32],
        }
    }

    /// The deterministic encoding (see the module docs).
    pub fn encode(&self) -> Result<Vec<u8>, CapabilityError> {
        let mut out = Vec::with_capacity(64 + self.tenant.len() + self.volume.len());
        out.push(CLAIMS_VERSION);
        for field in [&self.tenant, &self.volume, &self.pool, &self.container] {
            if field.len() > MAX_NAME_LEN {
                return Err(CapabilityError::Malformed(format!(
                    "name of {} bytes exceeds {MAX_NAME_LEN}",
                    field.len()
                )));
            }
            out.extend_from_slice(&(field.len() as u16).to_le_bytes());
            out.extend_from_slice(field.as_bytes());
        }
        out.push(self.rights.bits());
        out.extend_from_slice(&self.not_after.to_le_bytes());
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&self.holder);
        Ok(out)
    }

    /// Inverse of [`Capability::encode`]; strict (no trailing bytes, known bits only).
    pub fn decode(bytes: &[u8]) -> Result<Capability, CapabilityError> {
        let mut r = Reader(bytes);
        if r.take(1)?[0] != CLAIMS_VERSION {
            return Err(CapabilityError::Malformed("unknown claims version".into()));
        }
        let mut name = || -> Result<String, CapabilityError> {
            let len = u16::from_le_bytes(r.array()?) as usize;
            String::from_utf8(r.take(len)?.to_vec())
                .map_err(|_| CapabilityError::Malformed("name is not UTF-8".into()))
        };
        let (tenant, volume, pool, container) = (name()?, name()?, name()?, name()?);
        let bits = r.take(1)?[0];
        if bits > 3 {
            return Err(CapabilityError::Malformed("unknown rights bits".into()));
        }
        let not_after = u64::from_le_bytes(r.array()?);
        let nonce = r.array()?;
        let holder = r.array()?;
        if !r.0.is_empty() {
            return Err(CapabilityError::Malformed("trailing bytes".into()));
        }
        Ok(Capability {
            tenant,
            volume,
            pool,
            container,
            rights: Rights {
                read: bits & 1 != 0,
                write: bits & 2 != 0,
            },
            not_after,
            nonce,
            holder,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CapabilityError> {
        if self.0.len() < n {
            return Err(CapabilityError::Malformed("truncated".into()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CapabilityError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
}

/// A capability as the worker presents it: claims, the signing key's id, the signature; and,
/// as the agent issued it (never on the wire), the holder's private key.
#[derive(Clone)]
pub struct SignedCapability {
    key_id: String,
    claims: Vec<u8>,
    signature: Vec<u8>,
    holder: Option<HolderKey>,
}

/// Equal tokens: the same bytes on the wire.
impl PartialEq for SignedCapability {
    fn eq(&self, other: &SignedCapability) -> bool {
        (&self.key_id, &self.claims, &self.signature)
            == (&other.key_id, &other.claims, &other.signature)
    }
}

impl Eq for SignedCapability {}

impl fmt::Debug for SignedCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignedCapability")
            .field("key_id", &self.key_id)
            .field("claims", &Capability::decode(&self.claims))
            .finish_non_exhaustive()
    }
}

impl SignedCapability {
    /// Id of the key that signed it.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The encoded claims, as signed.
    pub(crate) fn claims_bytes(&self) -> &[u8] {
        &self.claims
    }

    /// The signature bytes.
    pub fn signature(&self) -> &[u8] {
        &self.signature
    }

    /// The claims, **not verified** (for logs and for the worker's own use).
    pub fn claims(&self) -> Result<Capability, CapabilityError> {
        Capability::decode(&self.claims)
    }

    /// Parts as they are on the wire, to build altered tokens in tests: no holder key.
    pub fn from_parts(key_id: String, claims: Vec<u8>, signature: Vec<u8>) -> SignedCapability {
        SignedCapability {
            key_id,
            claims,
            signature,
            holder: None,
        }
    }

    /// With the holder's private key, as the agent issues it.
    pub(crate) fn held_by(self, holder: HolderKey) -> SignedCapability {
        SignedCapability {
            holder: Some(holder),
            ..self
        }
    }

    /// The raw public half of the holder key the token carries, for tests.
    #[cfg(test)]
    pub(crate) fn holder_public(&self) -> Option<[u8; 32]> {
        self.holder.as_ref().and_then(|h| h.public_raw().ok())
    }

    /// Whether the holder's private key came with the token (it never does off the wire).
    pub fn has_holder_key(&self) -> bool {
        self.holder.is_some()
    }

    /// Signs `message` (the handshake's challenge and hello) with the holder's key; None
    /// without it: such a token was taken off the wire, not issued.
    pub(crate) fn prove(&self, message: &[u8]) -> Result<Option<Vec<u8>>, CapabilityError> {
        self.holder.as_ref().map(|h| h.sign(message)).transpose()
    }

    /// Wire form (see the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.key_id.len() + self.claims.len() + 64);
        out.extend_from_slice(&(self.key_id.len() as u16).to_le_bytes());
        out.extend_from_slice(self.key_id.as_bytes());
        out.extend_from_slice(&(self.claims.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.claims);
        out.extend_from_slice(&(self.signature.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.signature);
        out
    }

    /// Inverse of [`SignedCapability::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<SignedCapability, CapabilityError> {
        let mut r = Reader(bytes);
        let len = u16::from_le_bytes(r.array()?) as usize;
        let key_id = String::from_utf8(r.take(len)?.to_vec())
            .map_err(|_| CapabilityError::Malformed("key id is not UTF-8".into()))?;
        let len = u32::from_le_bytes(r.array()?) as usize;
        let claims = r.take(len)?.to_vec();
        let len = u16::from_le_bytes(r.array()?) as usize;
        let signature = r.take(len)?.to_vec();
        if !r.0.is_empty() {
            return Err(CapabilityError::Malformed("trailing bytes".into()));
        }
        Ok(SignedCapability::from_parts(key_id, claims, signature))
    }

    /// Hex of the wire form, with the holder's private key where the token carries it (for
    /// the worker's capability file and command lines: whoever reads it may present it).
    pub fn to_hex(&self) -> String {
        let mut hex = to_hex(&self.to_bytes());
        if let Some(holder) = &self.holder {
            hex.push(':');
            hex.push_str(&to_hex(&holder.private_raw()));
        }
        hex
    }

    /// Inverse of [`SignedCapability::to_hex`].
    pub fn from_hex(hex: &str) -> Result<SignedCapability, CapabilityError> {
        let (token, holder) = match hex.split_once(':') {
            Some((token, holder)) => (token, Some(from_hex(holder)?)),
            None => (hex, None),
        };
        let cap = SignedCapability::from_bytes(&from_hex(token)?)?;
        match holder {
            Some(raw) => Ok(cap.held_by(HolderKey::from_private_raw(&raw)?)),
            None => Ok(cap),
        }
    }
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(hex: &str) -> Result<Vec<u8>, CapabilityError> {
    let bad = || CapabilityError::Malformed("not hex".into());
    if !hex.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Fixed claims (tenant "acme", read-only) ending at `not_after`; the agent's tests sign
    /// them too.
    pub(crate) fn claims(not_after: u64) -> Capability {
        Capability {
            tenant: "acme".into(),
            volume: "pvc-1".into(),
            pool: "p".into(),
            container: "c".into(),
            rights: Rights::READ_ONLY,
            not_after,
            nonce: [7; 16],
            holder: [9; 32],
        }
    }

    #[test]
    fn lifetimes_are_bounded_and_expiry_allows_the_skew() {
        let (hour, skew) = (Duration::from_secs(3600), Duration::from_secs(30));
        let c = claims(10_000 + 3600);
        assert_eq!(c.check_lifetime(10_000, hour, skew), Ok(()));
        assert_eq!(c.check_lifetime(10_000 - 30, hour, skew), Ok(()));
        let err = c.check_lifetime(10_000 - 31, hour, skew).unwrap_err();
        assert!(
            matches!(err, CapabilityError::TooLong { max_secs: 3630, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("--capability-ttl-secs"), "{err}");
        assert!(!c.expired_at(13_600 + 30, skew));
        assert!(c.expired_at(13_600 + 31, skew));
    }

    #[test]
    fn encoding_is_deterministic_and_round_trips() {
        let c = claims(1_000);
        assert_eq!(c.encode().unwrap(), c.encode().unwrap());
        assert_eq!(Capability::decode(&c.encode().unwrap()).unwrap(), c);
        let mut bytes = c.encode().unwrap();
        bytes.push(0);
        assert!(matches!(
            Capability::decode(&bytes),
            Err(CapabilityError::Malformed(_))
        ));
        assert!(Capability::decode(&bytes[..10]).is_err());
    }
}
