//! Test and benchmark support: [`KvStore`], a small key-value [`Handler`] whose data is kept
//! per (tenant, volume) of the connection's *verified* capability, plus a gate that holds
//! requests so a test can act while a lease is bound or after a call has timed out. Not meant
//! for production use.
//!
//! Requests: one op byte and a key. `P` put (pulls the whole lease), `G` get (pushes the value,
//! up to the lease), `H` hold-then-get (waits at the gate first), `L` late push (waits at the
//! gate, then pushes [`LATE_FILL`] over the whole lease). Replies: `ok`, `none`, `err:<why>`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::handler::{BulkAccess, Handler, Request};
use super::lock;
use super::wire::LeaseClaim;

/// What a late push writes.
pub const LATE_FILL: u8 = 0xba;
/// Longest a gated request waits.
const GATE_LIMIT: Duration = Duration::from_secs(60);

/// A request that reached the gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Tenant of the connection.
    pub tenant: String,
    /// Request id.
    pub request_id: u64,
    /// The lease the request named.
    pub lease: Option<LeaseClaim>,
}

type Key = (String, String, Vec<u8>);

/// The store.
#[derive(Debug, Default)]
pub struct KvStore {
    data: Mutex<HashMap<Key, Vec<u8>>>,
    gate: Mutex<u64>,
    opened: Condvar,
    arrivals: Mutex<VecDeque<Arrival>>,
    arrived: Condvar,
    late: Mutex<Vec<Result<(), String>>>,
    handled: Mutex<HashMap<String, u64>>,
}

/// The store as a [`Handler`].
#[derive(Clone, Debug)]
pub struct KvHandler(pub Arc<KvStore>);

impl Handler for KvHandler {
    fn handle(&self, request: &Request<'_>, bulk: &mut BulkAccess<'_>, reply: &mut Vec<u8>) {
        self.0.serve(request, bulk, reply);
    }
}

fn op(code: u8, key: &str) -> Vec<u8> {
    let mut m = Vec::with_capacity(1 + key.len());
    m.push(code);
    m.extend_from_slice(key.as_bytes());
    m
}

impl KvStore {
    /// An empty store.
    pub fn new() -> Arc<KvStore> {
        Arc::new(KvStore::default())
    }

    /// Its handler.
    pub fn handler(self: &Arc<Self>) -> KvHandler {
        KvHandler(self.clone())
    }

    /// Request: store the bulk data under `key`.
    pub fn put(key: &str) -> Vec<u8> {
        op(b'P', key)
    }

    /// Request: push the value of `key`.
    pub fn get(key: &str) -> Vec<u8> {
        op(b'G', key)
    }

    /// Request: wait at the gate, then push the value of `key`.
    pub fn hold(key: &str) -> Vec<u8> {
        op(b'H', key)
    }

    /// Request: wait at the gate, then push [`LATE_FILL`] over the whole lease.
    pub fn late(key: &str) -> Vec<u8> {
        op(b'L', key)
    }

    /// Lets every request waiting at the gate go on.
    pub fn release(&self) {
        *lock(&self.gate) += 1;
        self.opened.notify_all();
    }

    /// The next request that reached the gate, waiting up to `timeout`.
    pub fn wait_arrival(&self, timeout: Duration) -> Option<Arrival> {
        let deadline = Instant::now() + timeout;
        let mut arrivals = lock(&self.arrivals);
        loop {
            if let Some(a) = arrivals.pop_front() {
                return Some(a);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            arrivals = self
                .arrived
                .wait_timeout(arrivals, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Outcomes of the late pushes so far.
    pub fn late_pushes(&self) -> Vec<Result<(), String>> {
        lock(&self.late).clone()
    }

    /// Requests of `tenant` handled.
    pub fn handled(&self, tenant: &str) -> u64 {
        lock(&self.handled).get(tenant).copied().unwrap_or(0)
    }

    /// The value of `key` for (`tenant`, `volume`).
    pub fn value(&self, tenant: &str, volume: &str, key: &str) -> Option<Vec<u8>> {
        let k = (
            tenant.to_owned(),
            volume.to_owned(),
            key.as_bytes().to_vec(),
        );
        lock(&self.data).get(&k).cloned()
    }

    fn wait_gate(&self, request: &Request<'_>) {
        let mut gate = lock(&self.gate);
        let seen = *gate;
        lock(&self.arrivals).push_back(Arrival {
            tenant: request.claims.tenant.clone(),
            request_id: request.request_id,
            lease: request.lease,
        });
        self.arrived.notify_all();
        let deadline = Instant::now() + GATE_LIMIT;
        while *gate == seen && Instant::now() < deadline {
            gate = self
                .opened
                .wait_timeout(gate, deadline - Instant::now())
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    fn serve(&self, request: &Request<'_>, bulk: &mut BulkAccess<'_>, reply: &mut Vec<u8>) {
        *lock(&self.handled)
            .entry(request.claims.tenant.clone())
            .or_default() += 1;
        let Some((&code, key)) = request.message.split_first() else {
            reply.extend_from_slice(b"err:empty request");
            return;
        };
        let claims = request.claims;
        let k: Key = (claims.tenant.clone(), claims.volume.clone(), key.to_vec());
        let result = match code {
            b'P' => {
                let mut value = vec![0; bulk.len()];
                bulk.pull(0, &mut value).map(|()| {
                    lock(&self.data).insert(k, value);
                    true
                })
            }
            b'G' | b'H' => {
                if code == b'H' {
                    self.wait_gate(request);
                }
                let value = lock(&self.data).get(&k).cloned();
                match value {
                    Some(v) => {
                        let n = v.len().min(bulk.len());
                        bulk.push(0, &v[..n]).map(|()| true)
                    }
                    None => Ok(false),
                }
            }
            b'L' => {
                self.wait_gate(request);
                let fill = vec![LATE_FILL; bulk.len()];
                let pushed = bulk.push(0, &fill);
                lock(&self.late).push(pushed.as_ref().map(|_| ()).map_err(|e| e.to_string()));
                pushed.map(|()| true)
            }
            _ => {
                reply.extend_from_slice(b"err:unknown op");
                return;
            }
        };
        match result {
            Ok(true) => reply.extend_from_slice(b"ok"),
            Ok(false) => reply.extend_from_slice(b"none"),
            Err(e) => {
                reply.extend_from_slice(b"err:");
                reply.extend_from_slice(e.to_string().as_bytes());
            }
        }
    }
}
