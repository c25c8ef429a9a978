//! Connections to the DAOS management service: channels per endpoint, leader
//! discovery, DAOS's version headers and the wire of the server's release (`wire`), and
//! DAOS's retry rules (docs/engine.md, "The management client's calls").

use crate::error::{DaosError, Result};
use crate::tls::{self, TlsFiles};
use crate::wire::{ServerVersion, Wire};
use dpufs_proto::daos::{COMPONENT_HEADER, VERSION_HEADER};
use dpufs_proto::mgmt::{LeaderQueryReq, mgmt_svc_client::MgmtSvcClient};
use hyper_util::rt::TokioIo;
use openssl::ssl::SslConnector;
use rand::seq::{IndexedRandom, SliceRandom};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// How DAOS clients pace retries: from 250 ms, doubling, capped near 8 s.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// dmg asks at most this many hosts at once when looking for the leader.
const MAX_DISCOVERY_HOSTS: usize = 5;
/// Redirects (NotLeader/NotReplica) followed before giving up.
const MAX_REDIRECTS: usize = 8;
/// Version refusals a call learns from before giving up: one names the server's
/// release; a second can only come from a server replaced by another release since.
const MAX_RELEARNS: usize = 2;

/// Where and how to reach the DAOS management service.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` or `unix:/path` of management-service hosts.
    pub endpoints: Vec<String>,
    /// DAOS system name.
    pub system: String,
    /// Deadline of ordinary requests, retries included (DAOS: 5 minutes).
    pub request_timeout: Duration,
    /// Deadline of PoolCreate (DAOS: 10 minutes).
    pub create_timeout: Duration,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// Plaintext h2c or DAOS's mutual TLS.
    pub security: Security,
}

/// How the management channel is protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Security {
    /// Plaintext h2c with no authentication: DAOS's `allow_insecure: true`.
    Insecure,
    /// Mutual TLS with these certificate files.
    Tls(TlsFiles),
}

impl ClientConfig {
    /// DAOS's defaults for the given endpoints.
    pub fn new(endpoints: Vec<String>) -> ClientConfig {
        ClientConfig {
            endpoints,
            system: dpufs_proto::daos::DEFAULT_SYSTEM.to_string(),
            request_timeout: Duration::from_secs(300),
            create_timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(5),
            security: Security::Insecure,
        }
    }

    /// The same configuration with mutual TLS.
    pub fn with_tls(mut self, files: TlsFiles) -> ClientConfig {
        self.security = Security::Tls(files);
        self
    }
}

/// Shared connection state of one client.
#[derive(Debug)]
pub(crate) struct Session {
    pub cfg: ClientConfig,
    /// Built once, so bad certificate files fail at construction.
    tls: Option<SslConnector>,
    channels: Mutex<HashMap<String, Channel>>,
    leader: Mutex<Option<String>>,
    /// The servers' version once a call has settled it: the one a refusal named, or
    /// the newest wire when a server accepted it. One for the session: a DAOS system
    /// runs one major.minor on all its servers.
    server: Mutex<Option<ServerVersion>>,
}

impl Session {
    pub fn new(cfg: ClientConfig) -> Result<Session> {
        if cfg.endpoints.is_empty() {
            return Err(DaosError::Config("no management endpoints given".into()));
        }
        for ep in &cfg.endpoints {
            endpoint_uri(ep)?;
        }
        let tls = match &cfg.security {
            Security::Insecure => None,
            Security::Tls(files) => Some(tls::connector(files)?),
        };
        Ok(Session {
            cfg,
            tls,
            channels: Mutex::new(HashMap::new()),
            leader: Mutex::new(None),
            server: Mutex::new(None),
        })
    }

    async fn channel(&self, endpoint: &str) -> Result<Channel> {
        if let Some(ch) = self.channels.lock().expect("channels lock").get(endpoint) {
            return Ok(ch.clone());
        }
        let uri = endpoint_uri(endpoint)?;
        let ep = Endpoint::from_shared(uri.clone())
            .map_err(|e| DaosError::Config(format!("endpoint {endpoint:?}: {e}")))?
            .connect_timeout(self.cfg.connect_timeout);
        let connected = match &self.tls {
            None => ep.connect().await,
            Some(connector) => {
                let Some(addr) = uri.strip_prefix("http://").map(str::to_string) else {
                    return Err(DaosError::Config(format!(
                        "TLS needs a HOST:PORT endpoint, not {endpoint:?}"
                    )));
                };
                let connector = connector.clone();
                ep.connect_with_connector(tower::service_fn(move |_| {
                    let (connector, addr) = (connector.clone(), addr.clone());
                    async move { tls::connect(&connector, &addr).await.map(TokioIo::new) }
                }))
                .await
            }
        };
        let ch = connected.map_err(|e| DaosError::Unreachable {
            endpoints: endpoint.to_string(),
            cause: error_chain(&e),
        })?;
        self.channels
            .lock()
            .expect("channels lock")
            .insert(endpoint.to_string(), ch.clone());
        Ok(ch)
    }

    fn forget(&self, endpoint: &str) {
        self.channels
            .lock()
            .expect("channels lock")
            .remove(endpoint);
        let mut leader = self.leader.lock().expect("leader lock");
        if leader.as_deref() == Some(endpoint) {
            *leader = None;
        }
    }

    /// The servers' version, once a call has settled it.
    pub fn server_version(&self) -> Option<ServerVersion> {
        *self.server.lock().expect("server lock")
    }

    /// The wire the next call speaks.
    pub fn wire(&self) -> Wire {
        self.speaking().0
    }

    /// The wire the next call speaks and the `x-daos-version` it announces, from one
    /// reading of what the session knows (a concurrent call may learn meanwhile).
    fn speaking(&self) -> (Wire, String) {
        let server = self
            .server_version()
            .unwrap_or(ServerVersion::of_wire(Wire::NEWEST));
        (Wire::of(&server).unwrap_or(Wire::NEWEST), server.announce())
    }

    /// A server accepted the call made on `wire`: when nothing named the version yet,
    /// it is that wire's release.
    fn accepted(&self, wire: Wire) {
        self.server
            .lock()
            .expect("server lock")
            .get_or_insert(ServerVersion::of_wire(wire));
    }

    /// Learns the server's version from a version refusal of a call that announced
    /// `refused`. True when the session now announces something else, so the call is
    /// worth repeating.
    fn learn(&self, err: &DaosError, refused: &str) -> bool {
        let DaosError::Incompatible { message } = err else {
            return false;
        };
        let Some(version) = ServerVersion::from_refusal(message) else {
            return false;
        };
        let Some(wire) = Wire::of(&version) else {
            return false;
        };
        *self.server.lock().expect("server lock") = Some(version);
        tracing::info!("DAOS server {version}: using the {wire} wire");
        self.speaking().1 != refused
    }

    /// A request with DAOS's version headers and the remaining deadline.
    fn request<T>(&self, msg: T, remaining: Duration, announced: &str) -> Request<T> {
        let mut req = Request::new(msg);
        let md = req.metadata_mut();
        let component = match &self.cfg.security {
            Security::Tls(files) => files.component.as_str(),
            Security::Insecure => "admin",
        };
        md.insert(
            COMPONENT_HEADER,
            component
                .parse()
                .unwrap_or_else(|_| "admin".parse().expect("ascii")),
        );
        md.insert(VERSION_HEADER, announced.parse().expect("ascii"));
        req.set_timeout(remaining);
        req
    }

    /// The endpoint of the management-service leader: asks up to five random
    /// endpoints at once and takes the first answer.
    async fn leader(&self) -> Result<String> {
        if let Some(l) = self.leader.lock().expect("leader lock").clone() {
            return Ok(l);
        }
        // With one endpoint there is nothing to choose: talk to it and follow
        // its NotLeader/NotReplica redirects, as dmg does.
        if let [only] = self.cfg.endpoints.as_slice() {
            return Ok(only.clone());
        }
        let mut candidates = self.cfg.endpoints.clone();
        candidates.shuffle(&mut rand::rng());
        candidates.truncate(MAX_DISCOVERY_HOSTS);
        let asks = candidates.iter().map(|ep| Box::pin(self.ask_leader(ep)));
        let (leader, _) = futures::future::select_ok(asks)
            .await
            .map_err(|e| match e {
                DaosError::Unreachable { cause, .. } => DaosError::Unreachable {
                    endpoints: candidates.join(", "),
                    cause,
                },
                other => other,
            })?;
        *self.leader.lock().expect("leader lock") = Some(leader.clone());
        Ok(leader)
    }

    async fn ask_leader(&self, endpoint: &str) -> Result<String> {
        let ch = self.channel(endpoint).await?;
        let ask = LeaderQueryReq {
            sys: self.cfg.system.clone(),
            hosts: String::new(),
        };
        let mut relearns = 0;
        let resp = loop {
            let (wire, announced) = self.speaking();
            let req = self.request(ask.clone(), self.cfg.connect_timeout, &announced);
            match MgmtSvcClient::new(ch.clone()).leader_query(req).await {
                Ok(resp) => {
                    self.accepted(wire);
                    break resp.into_inner();
                }
                // Components other than admin may not ask (DAOS's allow-list);
                // they talk to the endpoint they were given.
                Err(s) if s.code() == tonic::Code::PermissionDenied => {
                    return Ok(endpoint.to_string());
                }
                Err(s) => {
                    let err = DaosError::from_status(&s);
                    if relearns == MAX_RELEARNS || !self.learn(&err, &announced) {
                        return Err(err);
                    }
                    relearns += 1;
                }
            }
        };
        // A unix-socket endpoint, or a leader naming itself, is used as given:
        // its advertised TCP address may not be reachable from here.
        let own = endpoint.starts_with("unix:")
            || resp.current_leader.is_empty()
            || resp.replicas.len() <= 1;
        Ok(if own {
            endpoint.to_string()
        } else {
            resp.current_leader
        })
    }

    /// Calls the leader with DAOS's redirect and retry rules until `timeout`. `rpc`
    /// is given the wire of the server's release; a server of another release than
    /// announced refuses once, and the call is repeated on its wire.
    pub async fn call<Req, Resp, F, Fut>(&self, timeout: Duration, msg: Req, rpc: F) -> Result<Resp>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>, Wire) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let deadline = Instant::now() + timeout;
        let mut backoff = FIRST_BACKOFF;
        let mut redirects = 0;
        let mut relearns = 0;
        let mut reconnected = false;
        let mut target = self.leader().await?;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let ch = match self.channel(&target).await {
                Ok(ch) => ch,
                Err(e) => {
                    self.forget(&target);
                    return Err(e);
                }
            };
            let (wire, announced) = self.speaking();
            let req = self.request(msg.clone(), remaining, &announced);
            let err = match rpc(ch, req, wire).await {
                Ok(resp) => {
                    self.accepted(wire);
                    return Ok(resp.into_inner());
                }
                Err(status) => DaosError::from_status(&status),
            };
            match err {
                DaosError::Incompatible { .. }
                    if relearns < MAX_RELEARNS && self.learn(&err, &announced) =>
                {
                    relearns += 1;
                }
                DaosError::NotLeader {
                    leader_hint,
                    replicas,
                } if redirects < MAX_REDIRECTS => {
                    redirects += 1;
                    target = if leader_hint.is_empty() {
                        pick(&replicas)?
                    } else {
                        leader_hint
                    };
                    *self.leader.lock().expect("leader lock") = Some(target.clone());
                }
                DaosError::NotReplica { replicas } if redirects < MAX_REDIRECTS => {
                    redirects += 1;
                    target = pick(&replicas)?;
                }
                // A cached connection to a server that has since restarted
                // fails once; reconnect (rediscovering the leader) a single time.
                DaosError::Unreachable { .. } if !reconnected => {
                    reconnected = true;
                    self.forget(&target);
                    target = self.leader().await?;
                }
                DaosError::Unreachable { .. } => {
                    self.forget(&target);
                    return Err(err);
                }
                e if e.is_retryable() => {
                    if Instant::now() + backoff >= deadline {
                        return Err(DaosError::Timeout(timeout, Box::new(e)));
                    }
                    tracing::debug!(error = %e, ?backoff, "retrying DAOS request");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                e => return Err(e),
            }
        }
    }
}

fn pick(replicas: &[String]) -> Result<String> {
    replicas
        .choose(&mut rand::rng())
        .cloned()
        .ok_or_else(|| DaosError::Unreachable {
            endpoints: String::new(),
            cause: "redirected without a replica list".into(),
        })
}

/// `host:port` → `http://host:port`; `unix:/path` → `unix:///path`.
fn endpoint_uri(endpoint: &str) -> Result<String> {
    if let Some(path) = endpoint.strip_prefix("unix:") {
        let path = path.trim_start_matches("//");
        if !path.starts_with('/') {
            return Err(DaosError::Config(format!(
                "unix endpoint {endpoint:?} needs an absolute path"
            )));
        }
        return Ok(format!("unix://{path}"));
    }
    if endpoint.is_empty() || endpoint.contains("://") {
        return Err(DaosError::Config(format!(
            "endpoint {endpoint:?}: use HOST:PORT or unix:/PATH"
        )));
    }
    let with_port = if endpoint
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        endpoint.to_string()
    } else {
        format!("{endpoint}:{}", dpufs_proto::daos::DEFAULT_PORT)
    };
    Ok(format!("http://{with_port}"))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_become_uris() {
        assert_eq!(
            endpoint_uri("10.0.0.1:10001").unwrap(),
            "http://10.0.0.1:10001"
        );
        assert_eq!(endpoint_uri("daos-1").unwrap(), "http://daos-1:10001");
        assert_eq!(
            endpoint_uri("unix:/run/e.sock").unwrap(),
            "unix:///run/e.sock"
        );
        assert!(endpoint_uri("unix:rel.sock").is_err());
        assert!(endpoint_uri("http://x:1").is_err());
        assert!(Session::new(ClientConfig::new(vec![])).is_err());
    }
}
