//! The node agent's signing keys and the servers' trust in them (Ed25519 through OpenSSL).
//! Signing and checking follow the format in [`super::capability`].

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use openssl::pkey::{Id, PKey, Private, Public};
use openssl::sign::{Signer, Verifier};

use super::capability::{Capability, CapabilityError, SignedCapability};

const SIGNING_CONTEXT: &[u8] = b"dpufs-capability-v1\0";
/// What a holder signs, before the handshake's challenge and hello.
const PROOF_CONTEXT: &[u8] = b"dpufs-session-proof-v1\0";

fn crypto(e: openssl::error::ErrorStack) -> CapabilityError {
    CapabilityError::Crypto(e.to_string())
}

fn signed_message(key_id: &str, claims: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(SIGNING_CONTEXT.len() + 2 + key_id.len() + claims.len());
    m.extend_from_slice(SIGNING_CONTEXT);
    m.extend_from_slice(&(key_id.len() as u16).to_le_bytes());
    m.extend_from_slice(key_id.as_bytes());
    m.extend_from_slice(claims);
    m
}

fn key_id_of(raw: &[u8]) -> String {
    openssl::sha::sha256(raw)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The node agent's signing key (Ed25519).
pub struct AgentKey {
    key: PKey<Private>,
    id: String,
}

impl fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentKey")
            .field("key_id", &self.id)
            .finish_non_exhaustive()
    }
}

impl AgentKey {
    /// A new random key.
    pub fn generate() -> Result<AgentKey, CapabilityError> {
        AgentKey::from_pkey(PKey::generate_ed25519().map_err(crypto)?)
    }

    fn from_pkey(key: PKey<Private>) -> Result<AgentKey, CapabilityError> {
        if key.id() != Id::ED25519 {
            return Err(CapabilityError::Crypto("agent key is not Ed25519".into()));
        }
        let id = key_id_of(&key.raw_public_key().map_err(crypto)?);
        Ok(AgentKey { key, id })
    }

    /// From a PKCS#8 PEM private key.
    pub fn from_pem(pem: &[u8]) -> Result<AgentKey, CapabilityError> {
        AgentKey::from_pkey(PKey::private_key_from_pem(pem).map_err(crypto)?)
    }

    /// PKCS#8 PEM of the private key.
    pub fn to_pem(&self) -> Result<Vec<u8>, CapabilityError> {
        self.key.private_key_to_pem_pkcs8().map_err(crypto)
    }

    /// Loads the key at `path`, or generates one and writes it there (mode 0600). An existing
    /// key that group or others may read is refused: whoever reads it can sign capabilities
    /// for every tenant on the node (as DAOS refuses its own keys with wide permissions).
    pub fn load_or_generate(path: &Path) -> Result<AgentKey, CapabilityError> {
        let io = |op: &str, e: std::io::Error| {
            CapabilityError::Io(format!("{op} {}: {e}", path.display()))
        };
        match std::fs::File::open(path) {
            Ok(mut file) => {
                use std::io::Read;
                use std::os::unix::fs::PermissionsExt;
                // The mode of the file we opened, not of whatever the path names later.
                let mode = file
                    .metadata()
                    .map_err(|e| io("stat", e))?
                    .permissions()
                    .mode();
                if mode & 0o077 != 0 {
                    return Err(CapabilityError::Io(format!(
                        "the agent key {} has mode {:o}: group or others may read it and sign \
                         capabilities for any tenant; make it private (chmod 600 {0})",
                        path.display(),
                        mode & 0o777
                    )));
                }
                let mut pem = Vec::new();
                file.read_to_end(&mut pem).map_err(|e| io("read", e))?;
                AgentKey::from_pem(&pem)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let key = AgentKey::generate()?;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(|e| io("create", e))?;
                f.write_all(&key.to_pem()?).map_err(|e| io("write", e))?;
                Ok(key)
            }
            Err(e) => Err(io("read", e)),
        }
    }

    /// Key id (hex of 8 bytes of SHA-256 of the public key).
    pub fn key_id(&self) -> &str {
        &self.id
    }

    /// The public half, for the servers' [`TrustedAgents`].
    pub fn public_key(&self) -> Result<AgentPublicKey, CapabilityError> {
        AgentPublicKey::from_raw(&self.key.raw_public_key().map_err(crypto)?)
    }

    /// Signs `claims`, bound to a new holder key pair: the token carries its private half
    /// (for the worker, never on the wire) and the claims its public half.
    pub fn sign(&self, claims: &Capability) -> Result<SignedCapability, CapabilityError> {
        let holder = HolderKey::generate()?;
        let claims = Capability {
            holder: holder.public_raw()?,
            ..claims.clone()
        };
        Ok(self.sign_claims(&claims)?.held_by(holder))
    }

    /// Signs `claims` as they are.
    pub(crate) fn sign_claims(
        &self,
        claims: &Capability,
    ) -> Result<SignedCapability, CapabilityError> {
        let encoded = claims.encode()?;
        let mut signer = Signer::new_without_digest(&self.key).map_err(crypto)?;
        let signature = signer
            .sign_oneshot_to_vec(&signed_message(&self.id, &encoded))
            .map_err(crypto)?;
        Ok(SignedCapability::from_parts(
            self.id.clone(),
            encoded,
            signature,
        ))
    }
}

/// The key pair a capability is bound to (Ed25519): made by the agent for each token, its
/// private half handed to the worker with the token and never sent.
#[derive(Clone)]
pub(crate) struct HolderKey(PKey<Private>);

impl HolderKey {
    fn generate() -> Result<HolderKey, CapabilityError> {
        Ok(HolderKey(PKey::generate_ed25519().map_err(crypto)?))
    }

    pub(crate) fn from_private_raw(raw: &[u8]) -> Result<HolderKey, CapabilityError> {
        let key = PKey::private_key_from_raw_bytes(raw, Id::ED25519).map_err(crypto)?;
        Ok(HolderKey(key))
    }

    pub(crate) fn private_raw(&self) -> Vec<u8> {
        // Ed25519 keys made or read here always have their raw form.
        self.0.raw_private_key().unwrap_or_default()
    }

    pub(crate) fn public_raw(&self) -> Result<[u8; 32], CapabilityError> {
        let raw = self.0.raw_public_key().map_err(crypto)?;
        raw.try_into()
            .map_err(|_| CapabilityError::Crypto("holder key is not Ed25519".into()))
    }

    /// The proof for a handshake: a signature of `message` (the server's challenge and the
    /// hello) under the proof context.
    pub(crate) fn sign(&self, message: &[u8]) -> Result<Vec<u8>, CapabilityError> {
        let mut signer = Signer::new_without_digest(&self.0).map_err(crypto)?;
        signer
            .sign_oneshot_to_vec(&[PROOF_CONTEXT, message].concat())
            .map_err(crypto)
    }
}

/// Whether `proof` is the signature of `message` by the holder whose raw public key is
/// `holder` (see [`HolderKey::sign`]).
pub(crate) fn holder_proved(holder: &[u8; 32], message: &[u8], proof: &[u8]) -> bool {
    let Ok(key) = PKey::public_key_from_raw_bytes(holder, Id::ED25519) else {
        return false;
    };
    Verifier::new_without_digest(&key)
        .and_then(|mut v| v.verify_oneshot(proof, &[PROOF_CONTEXT, message].concat()))
        .unwrap_or(false)
}

/// A node agent's public key.
#[derive(Clone)]
pub struct AgentPublicKey {
    key: PKey<Public>,
    id: String,
}

impl fmt::Debug for AgentPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentPublicKey")
            .field("key_id", &self.id)
            .finish()
    }
}

impl AgentPublicKey {
    /// From the 32 raw bytes of an Ed25519 public key.
    pub fn from_raw(raw: &[u8]) -> Result<AgentPublicKey, CapabilityError> {
        let key = PKey::public_key_from_raw_bytes(raw, Id::ED25519).map_err(crypto)?;
        Ok(AgentPublicKey {
            key,
            id: key_id_of(raw),
        })
    }

    /// From a PEM (SubjectPublicKeyInfo) public key.
    pub fn from_pem(pem: &[u8]) -> Result<AgentPublicKey, CapabilityError> {
        let key = PKey::public_key_from_pem(pem).map_err(crypto)?;
        if key.id() != Id::ED25519 {
            return Err(CapabilityError::Crypto("agent key is not Ed25519".into()));
        }
        AgentPublicKey::from_raw(&key.raw_public_key().map_err(crypto)?)
    }

    /// PEM (SubjectPublicKeyInfo).
    pub fn to_pem(&self) -> Result<Vec<u8>, CapabilityError> {
        self.key.public_key_to_pem().map_err(crypto)
    }

    /// Key id.
    pub fn key_id(&self) -> &str {
        &self.id
    }
}

/// The agent keys a server accepts capabilities from, by key id.
#[derive(Clone, Debug, Default)]
pub struct TrustedAgents {
    keys: HashMap<String, AgentPublicKey>,
}

impl TrustedAgents {
    /// Trusts nobody yet.
    pub fn new() -> TrustedAgents {
        TrustedAgents::default()
    }

    /// Trusts `key`.
    pub fn add(&mut self, key: AgentPublicKey) {
        self.keys.insert(key.id.clone(), key);
    }

    /// Stops trusting key `key_id`; true if it was trusted.
    pub fn remove(&mut self, key_id: &str) -> bool {
        self.keys.remove(key_id).is_some()
    }

    /// Checks key id, signature and expiry (against `now`, unix seconds, allowing `skew`), in
    /// that order, and returns the claims.
    pub fn verify(
        &self,
        cap: &SignedCapability,
        now: u64,
        skew: Duration,
    ) -> Result<Capability, CapabilityError> {
        let key_id = cap.key_id();
        let key = self
            .keys
            .get(key_id)
            .ok_or_else(|| CapabilityError::UnknownKey {
                key_id: key_id.to_owned(),
            })?;
        let mut verifier = Verifier::new_without_digest(&key.key).map_err(crypto)?;
        let ok = verifier
            .verify_oneshot(cap.signature(), &signed_message(key_id, cap.claims_bytes()))
            .unwrap_or(false);
        if !ok {
            return Err(CapabilityError::BadSignature {
                key_id: key_id.to_owned(),
            });
        }
        let claims = Capability::decode(cap.claims_bytes())?;
        if claims.expired_at(now, skew) {
            return Err(CapabilityError::Expired {
                not_after: claims.not_after,
                now,
                skew_secs: skew.as_secs(),
            });
        }
        Ok(claims)
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Rights;
    use crate::session::capability::tests::claims;

    fn trusting(key: &AgentKey) -> TrustedAgents {
        let mut t = TrustedAgents::new();
        t.add(key.public_key().unwrap());
        t
    }

    #[test]
    fn sign_verify_and_wire_round_trip() {
        let key = AgentKey::generate().unwrap();
        let signed = key.sign(&claims(1_000)).unwrap();
        let back = SignedCapability::from_hex(&signed.to_hex()).unwrap();
        assert_eq!(back, signed);
        assert!(back.has_holder_key(), "the hex form carries the holder key");
        let got = trusting(&key).verify(&back, 999, Duration::ZERO).unwrap();
        // The claims as asked for, bound to the holder key the token carries.
        assert_eq!(got.holder, back.holder_public().unwrap());
        assert_eq!(
            got,
            Capability {
                holder: got.holder,
                ..claims(1_000)
            }
        );
        // Off the wire, the token has no holder key.
        let captured = SignedCapability::from_bytes(&signed.to_bytes()).unwrap();
        assert!(!captured.has_holder_key());
        assert_eq!(captured.prove(b"challenge").unwrap(), None);
    }

    #[test]
    fn only_the_holder_key_proves_and_only_for_the_message_it_signed() {
        let key = AgentKey::generate().unwrap();
        let signed = key.sign(&claims(1_000)).unwrap();
        let holder = signed.claims().unwrap().holder;
        let proof = signed.prove(b"challenge and hello").unwrap().unwrap();
        assert!(holder_proved(&holder, b"challenge and hello", &proof));
        assert!(!holder_proved(&holder, b"another challenge", &proof));
        let other = key.sign(&claims(1_000)).unwrap();
        let theirs = other.prove(b"challenge and hello").unwrap().unwrap();
        assert!(!holder_proved(&holder, b"challenge and hello", &theirs));
        assert!(!holder_proved(&[0; 32], b"challenge and hello", &proof));
    }

    #[test]
    fn altered_claims_or_foreign_keys_are_refused() {
        let key = AgentKey::generate().unwrap();
        let signed = key.sign(&claims(1_000)).unwrap();
        let mut widened = claims(1_000);
        widened.rights = Rights::READ_WRITE;
        let forged = SignedCapability::from_parts(
            signed.key_id().into(),
            widened.encode().unwrap(),
            signed.signature().to_vec(),
        );
        let trusted = trusting(&key);
        assert!(matches!(
            trusted.verify(&forged, 0, Duration::ZERO),
            Err(CapabilityError::BadSignature { .. })
        ));
        let other = AgentKey::generate().unwrap();
        let foreign = other.sign(&claims(1_000)).unwrap();
        assert!(matches!(
            trusted.verify(&foreign, 0, Duration::ZERO),
            Err(CapabilityError::UnknownKey { .. })
        ));
        // A signature moved under another trusted key id does not verify either.
        let mut both = trusted.clone();
        both.add(other.public_key().unwrap());
        let moved = SignedCapability::from_parts(
            other.key_id().into(),
            signed.claims_bytes().to_vec(),
            signed.signature().to_vec(),
        );
        assert!(matches!(
            both.verify(&moved, 0, Duration::ZERO),
            Err(CapabilityError::BadSignature { .. })
        ));
    }

    #[test]
    fn expiry_allows_only_the_skew() {
        let key = AgentKey::generate().unwrap();
        let signed = key.sign(&claims(1_000)).unwrap();
        let t = trusting(&key);
        assert!(t.verify(&signed, 1_000, Duration::ZERO).is_ok());
        assert!(t.verify(&signed, 1_030, Duration::from_secs(30)).is_ok());
        let err = t
            .verify(&signed, 1_031, Duration::from_secs(30))
            .unwrap_err();
        assert!(matches!(err, CapabilityError::Expired { .. }));
        assert!(err.to_string().contains("expired"), "{err}");
    }

    #[test]
    fn keys_round_trip_through_pem() {
        let key = AgentKey::generate().unwrap();
        let again = AgentKey::from_pem(&key.to_pem().unwrap()).unwrap();
        assert_eq!(again.key_id(), key.key_id());
        let public = AgentPublicKey::from_pem(&key.public_key().unwrap().to_pem().unwrap());
        assert_eq!(public.unwrap().key_id(), key.key_id());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.pem");
        let first = AgentKey::load_or_generate(&path).unwrap();
        let second = AgentKey::load_or_generate(&path).unwrap();
        assert_eq!(first.key_id(), second.key_id());
    }

    #[test]
    fn a_key_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.pem");
        let key = AgentKey::load_or_generate(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "a generated key is private");
        for wide in [0o640, 0o604, 0o644] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(wide)).unwrap();
            let err = AgentKey::load_or_generate(&path).unwrap_err().to_string();
            assert!(
                err.contains(&format!("mode {wide:o}")) && err.contains("chmod 600"),
                "{err}"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        let again = AgentKey::load_or_generate(&path).unwrap();
        assert_eq!(again.key_id(), key.key_id());
    }
}
