//! The fabric's decoders (`dpufs_fabric::fuzzing`): frames, endpoints, session headers and
//! capabilities from any peer; the handshake as an engine's data port reads it.

use dpufs_fabric::fuzzing;
use dpufs_fabric::session::{AgentKey, Capability, Rights, TrustedAgents};
use openssl::pkey::{Id, PKey};
use std::time::Duration;

/// The instant every handshake is judged at, so an input behaves the same in every run.
const NOW: u64 = 1_800_000_000;

pub fn wire(data: &[u8]) -> bool {
    // Every decoder sees every input (no short-circuit).
    [
        fuzzing::soft_frame(data),
        fuzzing::soft_endpoint(data),
        fuzzing::session_header(data),
        fuzzing::capability(data),
    ]
    .contains(&true)
}

/// The agent key the handshake seeds are signed with, and the engine's trust in it.
pub struct HandshakeKeys {
    key: AgentKey,
    trusted: TrustedAgents,
}

impl HandshakeKeys {
    /// Made from a fixed seed, so the checked-in seeds verify in every run.
    pub fn new() -> HandshakeKeys {
        let pkey = PKey::private_key_from_raw_bytes(&[7; 32], Id::ED25519).expect("an Ed25519 key");
        let pem = pkey.private_key_to_pem_pkcs8().expect("PEM");
        let key = AgentKey::from_pem(&pem).expect("an agent key");
        let mut trusted = TrustedAgents::new();
        trusted.add(key.public_key().expect("its public key"));
        HandshakeKeys { key, trusted }
    }
}

pub fn handshake(keys: &HandshakeKeys, data: &[u8]) -> bool {
    fuzzing::handshake(data, &keys.trusted, NOW)
}

pub fn wire_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut seeds = fuzzing::wire_seeds();
    let claims = claims();
    seeds.push(("claims", claims.encode().expect("claims encode")));
    let signed = fuzzing::sign_held_by(&HandshakeKeys::new().key, &claims, HOLDER);
    seeds.push(("signed-capability", signed.to_bytes()));
    seeds
}

pub fn handshake_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let signed = fuzzing::sign_held_by(&HandshakeKeys::new().key, &claims(), HOLDER);
    fuzzing::handshake_seeds(&signed)
}

/// The seeds' holder key (its private half), fixed like the agent's.
const HOLDER: [u8; 32] = [8; 32];

/// Claims valid an hour past [`NOW`].
fn claims() -> Capability {
    let mut c = Capability::new(
        "team-a",
        "vol-1",
        "0b7e5c1e-6a8f-4d6e-9a55-3f2d1c0b9a87",
        "5d0c6b2a-1e4f-4a3b-8c7d-9e0f1a2b3c4d",
        Rights {
            read: true,
            write: true,
        },
        Duration::from_secs(3600),
    );
    c.not_after = NOW + 3600;
    c.nonce = [9; 16];
    c
}
