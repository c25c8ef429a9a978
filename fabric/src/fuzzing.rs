//! Entry points for the fuzz targets (`fuzz/`, docs/reliability.md). Each takes bytes as a
//! peer would send them to one of this crate's decoders and checks what the decoder promises
//! beyond not panicking: whatever decodes, encodes to bytes that decode to the same value.
//! Each returns whether its decoders accepted the input. Built only with the `fuzzing`
//! feature.

use crate::Endpoint;
use crate::session::agent::{HolderKey, holder_proved};
use crate::session::wire::{
    Answer, Challenge, Hello, LeaseClaim, LeaseRight, PROTOCOL_VERSION, ReplyHeader, ReplyStatus,
    RequestHeader,
};
use crate::session::{AgentKey, Capability, SignedCapability, TrustedAgents};
use crate::soft::cm::PeerInfo;
use crate::soft::wire::{Frame, HEADER_LEN, Op};
use std::time::Duration;

/// A software-RDMA frame header, as a peer's QP sends it on the wire.
pub fn soft_frame(data: &[u8]) -> bool {
    let Some(header) = data.first_chunk::<HEADER_LEN>() else {
        return false;
    };
    let Ok(frame) = Frame::decode(header) else {
        return false;
    };
    let again = Frame::decode(&frame.encode()).expect("an encoded frame decodes");
    assert_eq!(again, frame);
    true
}

/// A software QP's connection endpoint, as the peer hands it over at RTR.
pub fn soft_endpoint(data: &[u8]) -> bool {
    let Ok(peer) = PeerInfo::decode(&Endpoint(data.to_vec())) else {
        return false;
    };
    let again = PeerInfo::decode(&peer.encode()).expect("an encoded endpoint decodes");
    assert_eq!(again, peer);
    true
}

/// A session request or reply header, as the other end of a connection sends it.
pub fn session_header(data: &[u8]) -> bool {
    let request = RequestHeader::decode(data);
    if let Some(h) = request {
        assert_eq!(RequestHeader::decode(&h.encode()), Some(h));
    }
    let reply = ReplyHeader::decode(data);
    if let Some(h) = reply {
        assert_eq!(ReplyHeader::decode(&h.encode()), Some(h));
    }
    request.is_some() || reply.is_some()
}

/// A session handshake as the server reads it: the hello, its signed capability checked
/// against `trusted` at `now`, and the claims; and the answer as the client reads it.
pub fn handshake(data: &[u8], trusted: &TrustedAgents, now: u64) -> bool {
    let mut accepted = false;
    if let Ok(hello) = Hello::read(&mut &data[..]) {
        let out = hello.encoded();
        assert_eq!(
            Hello::read(&mut &out[..]).expect("a written hello reads"),
            hello
        );
        if let Ok(cap) = SignedCapability::from_bytes(&hello.capability) {
            if let Ok(claims) = trusted.verify(&cap, now, Duration::from_secs(30)) {
                let lifetime = Duration::from_secs(86_400);
                let message = hello.proof_message(&SEED_CHALLENGE);
                accepted |= claims.check_lifetime(now, lifetime, Duration::ZERO).is_ok()
                    && holder_proved(&claims.holder, &message, &hello.proof);
            }
            let _ = cap.claims();
        }
    }
    if let Ok(answer) = Answer::read(&mut &data[..]) {
        let out = answer.encoded();
        let again = Answer::read(&mut &out[..]).expect("a written answer reads");
        assert_eq!(again, answer);
        accepted = true;
    }
    accepted
}

/// A capability's signed form and its claims, each on its own.
pub fn capability(data: &[u8]) -> bool {
    let signed = SignedCapability::from_bytes(data);
    if let Ok(cap) = &signed {
        let again = SignedCapability::from_bytes(&cap.to_bytes()).expect("encoded decodes");
        assert!(again == *cap);
        let hex = SignedCapability::from_hex(&cap.to_hex()).expect("its hex form decodes");
        assert!(hex == *cap);
    }
    let claims = Capability::decode(data);
    if let Ok(claims) = &claims {
        let bytes = claims.encode().expect("decoded claims encode");
        assert_eq!(
            Capability::decode(&bytes).expect("encoded decodes"),
            *claims
        );
    }
    signed.is_ok() || claims.is_ok()
}

/// Valid frames, endpoints and headers made by this crate's encoders: seeds for the corpus.
pub fn wire_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let write = Frame {
        key: 0x0102_0304,
        len: 4096,
        addr: 0x1000,
        ..Frame::new(Op::Write, 7)
    };
    let nak = Frame {
        code: 2,
        ..Frame::new(Op::Nak, 8)
    };
    let peer = PeerInfo {
        addr: "127.0.0.1:4801".parse().expect("an address"),
        qp_num: 12,
        psn: 99,
        device: 0xabc,
        ctx: 3,
    };
    let request = RequestHeader {
        flags: 1,
        tag: 5,
        request_id: 42,
        lease: Some(LeaseClaim {
            rkey: 0x0a0b_0c0d,
            addr: 0,
            len: 65536,
            right: LeaseRight::RemoteRead,
        }),
        msg_len: 100,
    };
    let reply = ReplyHeader {
        status: ReplyStatus::Refused,
        tag: 5,
        request_id: 42,
        bulk_len: 0,
        msg_len: 12,
    };
    vec![
        ("frame-write", write.encode().to_vec()),
        ("frame-nak", nak.encode().to_vec()),
        (
            "frame-read-request",
            Frame::new(Op::ReadReq, 1).encode().to_vec(),
        ),
        ("endpoint", peer.encode().0),
        ("request-header", request.encode().to_vec()),
        ("reply-header", reply.encode().to_vec()),
    ]
}

/// The challenge the seeds' hellos answer, and against which [`handshake`] checks proofs.
const SEED_CHALLENGE: Challenge = Challenge([3; 32]);

/// `claims` signed by `agent` for the holder key whose private half is `holder`: a
/// deterministic token, for seeds that must be the same in every run.
pub fn sign_held_by(agent: &AgentKey, claims: &Capability, holder: [u8; 32]) -> SignedCapability {
    let holder = HolderKey::from_private_raw(&holder).expect("an Ed25519 key");
    let claims = Capability {
        holder: holder.public_raw().expect("its public half"),
        ..claims.clone()
    };
    agent.sign_claims(&claims).expect("signed").held_by(holder)
}

/// A hello carrying `capability` and its proof for the seeds' challenge, as a client sends
/// it; and the answers a server sends.
pub fn handshake_seeds(capability: &SignedCapability) -> Vec<(&'static str, Vec<u8>)> {
    let mut hello = Hello {
        version: PROTOCOL_VERSION,
        depth: 8,
        max_bulk: 1 << 20,
        capability: capability.to_bytes(),
        endpoint: PeerInfo {
            addr: "127.0.0.1:4801".parse().expect("an address"),
            qp_num: 1,
            psn: 2,
            device: 3,
            ctx: 4,
        }
        .encode(),
        proof: Vec::new(),
    };
    hello.proof = capability
        .prove(&hello.proof_message(&SEED_CHALLENGE))
        .expect("signed")
        .expect("a token with its holder key");
    let accept = Answer::Accept {
        depth: 8,
        max_bulk: 1 << 20,
        endpoint: Endpoint(b"tcp:127.0.0.1:4802/qp=2/psn=3/dev=4/ctx=5".to_vec()),
    };
    let refuse = Answer::Refuse {
        reason: "tenant \"a\" has its maximum of 4 connections".into(),
    };
    [
        ("hello", hello.encoded()),
        ("accept", accept.encoded()),
        ("refuse", refuse.encoded()),
    ]
    .into_iter()
    .collect()
}

impl Hello {
    fn encoded(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out).expect("to memory");
        out
    }
}

impl Answer {
    fn encoded(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out).expect("to memory");
        out
    }
}
