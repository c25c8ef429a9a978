//! `DaosSystem`: where a DAOS system's management service listens and how
//! dpufs authenticates to it.

use crate::validation;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

/// Where the DAOS management service listens and how dpufs authenticates to
/// it. DaosPools name the DaosSystem in `spec.systemRef`.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "dpufs.io",
    version = "v1alpha1",
    kind = "DaosSystem",
    shortname = "dsys",
    category = "dpufs",
    status = "DaosSystemStatus",
    derive = "PartialEq",
    doc = "A DAOS system dpufs creates pools in: management endpoints and admin credentials. Cluster-scoped, so only cluster administrators can point dpufs at a DAOS system.",
    printcolumn = r#"{"name":"System","type":"string","jsonPath":".spec.name"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#,
    printcolumn = r#"{"name":"Server","type":"string","jsonPath":".status.serverVersion"}"#,
    printcolumn = r#"{"name":"Leader","type":"string","jsonPath":".status.leader"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = spec_rules)]
pub struct DaosSystemSpec {
    /// DAOS system name, the `name` in daos_server.yml (at most 15 characters).
    /// Cannot be changed.
    #[serde(default = "default_system_name")]
    #[schemars(transform = validation::system_name)]
    pub name: String,

    /// Management service endpoints as `host` or `host:port` (port 10001 when
    /// omitted; IPv6 addresses in brackets). Any server of the system will do:
    /// dpufs finds the leader from there.
    #[schemars(transform = validation::endpoints)]
    pub endpoints: Vec<String>,

    /// DAOS version of the servers, `major.minor.patch`. dpufs speaks the DAOS
    /// 2.6 and 2.8 management APIs.
    #[schemars(transform = validation::daos_version)]
    pub version: String,

    /// Mutual TLS with the DAOS admin certificate: the default and what DAOS
    /// servers expect unless they run with `allow_insecure`. Exactly one of
    /// `tls` and `insecure: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<SystemTls>,

    /// Talk to a DAOS system that runs with `allow_insecure: true`: plaintext
    /// and no authentication, for test systems only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,

    /// Where nodes reach the system's DFS data service over the fabric,
    /// `ip:port` (IPv6 in brackets): the embedded engine's fabric address, what
    /// `dpufs-engine` writes to `fabric.addr`. The CSI node plugin mounts
    /// volumes there; without it, nodes refuse to stage this system's volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = validation::data_endpoint)]
    pub data_endpoint: Option<String>,

    /// How dpufs does what DAOS offers only in its client libraries (containers):
    /// `engine` (the default) through the embedded engine's container service; `daos`
    /// through DAOS's own libdaos and libdfs, for a real DAOS system, which needs the
    /// operator started with `--daos-lib` next to a DAOS agent (docs/real-daos.md).
    #[serde(default, skip_serializing_if = "DaosBackend::is_engine")]
    pub backend: DaosBackend,
}

/// Where container operations go; see [`DaosSystemSpec::backend`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DaosBackend {
    /// The embedded engine's container service.
    #[default]
    Engine,
    /// DAOS's client libraries (libdaos, libdfs).
    Daos,
}

impl DaosBackend {
    /// The default, which serialized objects leave out.
    pub fn is_engine(&self) -> bool {
        *self == DaosBackend::Engine
    }
}

fn default_system_name() -> String {
    "daos_server".to_string()
}

fn spec_rules(schema: &mut Schema) {
    validation::push(
        schema,
        validation::rule(
            "has(self.tls) != (has(self.insecure) && self.insecure)",
            "has(self.tls) ? 'tls and insecure: true contradict each other; remove one of them' : 'set tls.secretRef to the Secret with the DAOS admin certificate, or insecure: true for a DAOS system without TLS'",
        ),
    );
}

/// Where the DAOS admin certificate is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SystemTls {
    /// Secret with the files DAOS's gen_certificates.sh writes: `daosCA.crt`
    /// (the CA), `admin.crt` and `admin.key` (the admin certificate and key).
    pub secret_ref: SecretRef,
}

/// A Secret in a namespace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Name of the Secret.
    #[schemars(transform = validation::object_name)]
    pub name: String,
    /// Namespace of the Secret.
    #[schemars(transform = validation::namespace_name)]
    pub namespace: String,
}

/// What dpufs last saw of the DAOS system: written by the operator after each
/// query of the management service (every minute and on every change).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DaosSystemStatus {
    /// Management service leader, `host:port`, as the replica the operator
    /// reached reports it (DAOS LeaderQuery). Absent while the management
    /// service does not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,

    /// Management service replicas, `host:port`, the leader included. Absent
    /// while the management service does not answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<String>,

    /// The ranks (engines) of the system as SystemQuery reports them. Absent
    /// while the management service does not answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<SystemRank>,

    /// The DAOS release of the servers as the operator learned it: `2.6.5` when a
    /// server named its version (it refused dpufs's newest wire, 2.8), `2.8` when a
    /// server accepted that wire (DAOS then never says its patch level). Absent while
    /// the management service does not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`: the management service answers with these credentials and
    /// runs the release `spec.version` names. When False, the reason says what is
    /// wrong: `Unreachable`, `TlsRejected`, `VersionIncompatible`,
    /// `SecretMissing`, `SecretInvalid`, `ConfigInvalid`, `WrongSystem` or
    /// `DaosError`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = validation::conditions)]
    pub conditions: Vec<Condition>,
}

/// One rank (engine) of a DAOS system.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SystemRank {
    /// Rank number.
    pub rank: u32,

    /// Member state as DAOS puts it on the wire, for example `joined`, `stopped`,
    /// `excluded`, `adminexcluded`, `errored` or `unresponsive`.
    pub state: String,

    /// Control-plane address (`host:port`) of the server the rank runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,

    /// Fault domain of the rank, for example `/rack1/node3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault_domain: Option<String>,
}

impl DaosSystemStatus {
    /// A `ranks` entry. (`SystemRank` is reachable through this constructor
    /// until the crate root re-exports it.)
    pub fn rank(
        rank: u32,
        state: impl Into<String>,
        address: Option<String>,
        fault_domain: Option<String>,
    ) -> SystemRank {
        SystemRank {
            rank,
            state: state.into(),
            address,
            fault_domain,
        }
    }
}
