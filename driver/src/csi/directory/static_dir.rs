//! [`StaticDirectory`]: a [`Directory`] with a fixed configuration, read from JSON: one
//! system, a map of pools, tenants, and a default tenant for requests without a PVC
//! namespace (conformance suites send none). It serves `dpufs up` and the tests.

use super::{Directory, DirectoryError, PoolRef, SystemClients, Tenant, VolumeAccess};
use crate::csi::params::{valid_namespace, valid_object_name};
use crate::csi::volume_id::valid_system_name;
use dpufs_api::DaosBackend;
use dpufs_daos::{ClientConfig, ContainerAdmin, EngineContainers, MgmtClient, TlsFiles};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// The configuration of a [`StaticDirectory`], e.g. read from JSON:
///
/// ```json
/// {
///   "system": {"name": "daos_server", "endpoints": ["127.0.0.1:10001"]},
///   "pools": {"default": "6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f"},
///   "tenants": [{"name": "default", "principal": "dpufs@", "namespaces": ["default"],
///                "allowedPools": ["default"]}],
///   "defaultTenant": "default"
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticConfig {
    pub system: StaticSystem,
    /// DaosPool names and their UUIDs.
    #[serde(default)]
    pub pools: BTreeMap<String, Uuid>,
    #[serde(default)]
    pub tenants: Vec<StaticTenant>,
    /// The tenant of requests that name no PVC namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_tenant: Option<String>,
}

/// The one DAOS system of a [`StaticConfig`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticSystem {
    /// DAOS system name; `daos_server` when omitted.
    #[serde(default = "default_system_name")]
    pub name: String,
    /// Management service endpoints, `host:port`.
    pub endpoints: Vec<String>,
    /// Directory with `daosCA.crt`, `admin.crt`, `admin.key` for mutual TLS; plaintext
    /// (DAOS `allow_insecure`) when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_dir: Option<PathBuf>,
    /// How long one DAOS call may take, retries included (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_seconds: Option<u64>,
    /// The engine's fabric data service, `ip:port` (what `dpufs-engine` writes to
    /// `fabric.addr`): where node plugins' workers mount volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_endpoint: Option<std::net::SocketAddr>,
    /// `engine` (the default): volumes through the embedded engine at `dataEndpoint`;
    /// `daos`: a real DAOS system, containers through libdaos and volumes through libdfs
    /// (the plugins need `--daos-lib`, nodes `--tenant-uids`).
    #[serde(default, skip_serializing_if = "DaosBackend::is_engine")]
    pub backend: DaosBackend,
}

fn default_system_name() -> String {
    dpufs_proto::daos::DEFAULT_SYSTEM.to_string()
}

/// A tenant of a [`StaticConfig`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticTenant {
    pub name: String,
    pub principal: String,
    #[serde(default)]
    pub namespaces: Vec<String>,
    pub allowed_pools: Vec<String>,
    /// The uid of the tenant's volume workers on every node (DaosTenant `spec.uid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
}

/// Why a [`StaticConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("static directory configuration: {0}")]
pub struct ConfigError(pub String);

/// A [`Directory`] with a fixed configuration.
#[derive(Debug, Clone)]
pub struct StaticDirectory {
    config: StaticConfig,
    clients: SystemClients,
}

impl StaticDirectory {
    /// Checks the configuration and builds the system's clients; a system with `backend:
    /// daos` is refused (it needs [`StaticDirectory::open`] with DAOS's libraries).
    pub fn new(config: StaticConfig) -> Result<StaticDirectory, ConfigError> {
        StaticDirectory::open(config, None)
    }

    /// The same, with DAOS's client libraries in `daos_lib` (the plugin's `--daos-lib`)
    /// for a system with `backend: daos`.
    pub fn open(
        config: StaticConfig,
        daos_lib: Option<&Path>,
    ) -> Result<StaticDirectory, ConfigError> {
        check(&config)?;
        let sys = &config.system;
        let mut cfg = ClientConfig::new(sys.endpoints.clone());
        cfg.system = sys.name.clone();
        cfg.request_timeout = Duration::from_secs(sys.request_timeout_seconds.unwrap_or(30));
        if let Some(dir) = &sys.tls_dir {
            cfg = cfg.with_tls(TlsFiles::in_dir(dir, "admin"));
        }
        let mgmt = MgmtClient::new(cfg).map_err(|e| ConfigError(e.to_string()))?;
        let (containers, volumes): (Arc<dyn ContainerAdmin>, _) = match sys.backend {
            DaosBackend::Engine => (
                Arc::new(EngineContainers::new(&mgmt)),
                VolumeAccess::Engine {
                    data_endpoint: sys.data_endpoint,
                },
            ),
            DaosBackend::Daos => {
                let lib = daos_lib.ok_or_else(|| {
                    ConfigError(format!(
                        "system {:?} has backend daos: start the plugin with --daos-lib DIR \
                         (the directory of DAOS's libdfs.so)",
                        sys.name
                    ))
                })?;
                (
                    dpufs_kube::libdaos_containers(Some(lib)).map_err(ConfigError)?,
                    VolumeAccess::Daos {
                        lib: lib.to_path_buf(),
                    },
                )
            }
        };
        let clients = SystemClients {
            name: sys.name.clone(),
            containers,
            mgmt,
            volumes,
        };
        Ok(StaticDirectory { config, clients })
    }

    /// Reads a JSON configuration file; `daos_lib` as for [`StaticDirectory::open`].
    pub fn from_file(path: &Path, daos_lib: Option<&Path>) -> Result<StaticDirectory, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
        let config: StaticConfig = serde_json::from_str(&text)
            .map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
        StaticDirectory::open(config, daos_lib)
    }

    pub fn config(&self) -> &StaticConfig {
        &self.config
    }
}

/// A DAOS user principal a tenant can be granted: `name@` or `name@domain`, not special.
pub fn valid_tenant_principal(p: &str) -> bool {
    if matches!(p, "OWNER@" | "GROUP@" | "EVERYONE@") || p.len() > 255 {
        return false;
    }
    p.split_once('@').is_some_and(|(name, domain)| {
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '$'))
            && !domain.contains(['@', ':', ' '])
    })
}

fn check(c: &StaticConfig) -> Result<(), ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    if !valid_system_name(&c.system.name) {
        return err(format!(
            "system name {:?}: use 1 to 15 letters, digits, ., _ or -",
            c.system.name
        ));
    }
    if c.system.endpoints.is_empty() {
        return err("the system has no endpoints".into());
    }
    for name in c.pools.keys() {
        if !valid_object_name(name) {
            return err(format!(
                "pool name {name:?} is not a Kubernetes object name"
            ));
        }
    }
    let mut namespaces = BTreeMap::new();
    for (i, t) in c.tenants.iter().enumerate() {
        if c.tenants[..i].iter().any(|u| u.name == t.name) {
            return err(format!("tenant {:?} is listed twice", t.name));
        }
        if !valid_tenant_principal(&t.principal) {
            return err(format!(
                "tenant {:?}: principal {:?} must be name@ (not OWNER@, GROUP@ or EVERYONE@)",
                t.name, t.principal
            ));
        }
        if t.allowed_pools.is_empty() {
            return err(format!("tenant {:?} has no allowedPools", t.name));
        }
        if let Some(uid) = t.uid {
            if !(1000..u32::MAX).contains(&uid) {
                return err(format!(
                    "tenant {:?}: uid {uid} is a system account's; use 1000 or above",
                    t.name
                ));
            }
            if let Some(other) = c.tenants[..i].iter().find(|u| u.uid == Some(uid)) {
                return err(format!(
                    "tenants {:?} and {:?} have the same uid {uid}",
                    other.name, t.name
                ));
            }
        }
        for p in &t.allowed_pools {
            if !c.pools.contains_key(p) {
                return err(format!(
                    "tenant {:?}: allowed pool {p:?} is not in pools",
                    t.name
                ));
            }
        }
        for ns in &t.namespaces {
            if !valid_namespace(ns) {
                return err(format!(
                    "tenant {:?}: {ns:?} is not a namespace name",
                    t.name
                ));
            }
            if let Some(other) = namespaces.insert(ns.clone(), t.name.clone()) {
                return err(format!(
                    "namespace {ns:?} belongs to tenants {other:?} and {:?}",
                    t.name
                ));
            }
        }
    }
    if let Some(d) = &c.default_tenant
        && !c.tenants.iter().any(|t| &t.name == d)
    {
        return err(format!("default tenant {d:?} is not in tenants"));
    }
    Ok(())
}

fn tenant_of(t: &StaticTenant) -> Tenant {
    Tenant {
        name: t.name.clone(),
        principal: t.principal.clone(),
        allowed_pools: t.allowed_pools.clone(),
        uid: t.uid,
    }
}

#[tonic::async_trait]
impl Directory for StaticDirectory {
    async fn default_system(&self) -> Result<String, DirectoryError> {
        Ok(self.config.system.name.clone())
    }

    async fn system(&self, name: &str) -> Result<SystemClients, DirectoryError> {
        if name == self.config.system.name {
            Ok(self.clients.clone())
        } else {
            Err(DirectoryError::UnknownSystem(name.to_string()))
        }
    }

    async fn pool(&self, system: &str, pool: &str) -> Result<PoolRef, DirectoryError> {
        if system != self.config.system.name {
            return Err(DirectoryError::UnknownSystem(system.to_string()));
        }
        match self.config.pools.get(pool) {
            Some(uuid) => Ok(PoolRef {
                name: pool.to_string(),
                uuid: *uuid,
            }),
            None => Err(DirectoryError::UnknownPool {
                system: system.to_string(),
                pool: pool.to_string(),
            }),
        }
    }

    async fn pools(&self, system: &str) -> Result<Vec<PoolRef>, DirectoryError> {
        if system != self.config.system.name {
            return Err(DirectoryError::UnknownSystem(system.to_string()));
        }
        Ok(self
            .config
            .pools
            .iter()
            .map(|(name, uuid)| PoolRef {
                name: name.clone(),
                uuid: *uuid,
            })
            .collect())
    }

    async fn tenant(&self, namespace: Option<&str>) -> Result<Tenant, DirectoryError> {
        let found = match namespace {
            Some(ns) => self
                .config
                .tenants
                .iter()
                .find(|t| t.namespaces.iter().any(|n| n == ns))
                .ok_or_else(|| DirectoryError::NoTenant(ns.to_string()))?,
            None => {
                let name = self
                    .config
                    .default_tenant
                    .as_ref()
                    .ok_or(DirectoryError::NoDefaultTenant)?;
                self.config
                    .tenants
                    .iter()
                    .find(|t| &t.name == name)
                    .ok_or(DirectoryError::NoDefaultTenant)?
            }
        };
        Ok(tenant_of(found))
    }

    async fn tenant_named(&self, name: &str) -> Result<Option<Tenant>, DirectoryError> {
        Ok(self
            .config
            .tenants
            .iter()
            .find(|t| t.name == name)
            .map(tenant_of))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P1: &str = "6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f";
    const P2: &str = "0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b";

    fn config() -> StaticConfig {
        serde_json::from_value(serde_json::json!({
            "system": {"name": "daos_server", "endpoints": ["127.0.0.1:1"]},
            "pools": {"fast": P1, "bulk": P2},
            "tenants": [
                {"name": "a", "principal": "team-a@", "namespaces": ["ns-a", "ns-a2"], "allowedPools": ["fast"]},
                {"name": "b", "principal": "team-b@", "namespaces": ["ns-b"], "allowedPools": ["fast", "bulk"]}
            ],
            "defaultTenant": "b"
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn answers_from_the_configuration() {
        let d = StaticDirectory::new(config()).unwrap();
        assert_eq!(d.default_system().await.unwrap(), "daos_server");
        assert_eq!(d.system("daos_server").await.unwrap().name, "daos_server");
        assert_eq!(
            d.system("other").await.unwrap_err(),
            DirectoryError::UnknownSystem("other".into())
        );
        assert_eq!(
            d.pool("daos_server", "bulk").await.unwrap(),
            PoolRef {
                name: "bulk".into(),
                uuid: P2.parse().unwrap()
            }
        );
        assert!(matches!(
            d.pool("daos_server", "nope").await,
            Err(DirectoryError::UnknownPool { .. })
        ));
        assert_eq!(d.tenant(Some("ns-a2")).await.unwrap().principal, "team-a@");
        assert_eq!(d.tenant(None).await.unwrap().name, "b");
        assert_eq!(
            d.tenant_named("a").await.unwrap().unwrap().principal,
            "team-a@"
        );
        assert_eq!(d.tenant_named("gone").await.unwrap(), None);
        assert_eq!(
            d.tenant(Some("elsewhere")).await.unwrap_err(),
            DirectoryError::NoTenant("elsewhere".into())
        );
        assert!(d.ready());
    }

    #[tokio::test]
    async fn no_default_tenant() {
        let mut c = config();
        c.default_tenant = None;
        let d = StaticDirectory::new(c).unwrap();
        assert_eq!(
            d.tenant(None).await.unwrap_err(),
            DirectoryError::NoDefaultTenant
        );
    }

    #[test]
    fn bad_configurations_are_refused() {
        type Change = Box<dyn Fn(&mut StaticConfig)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|c| c.system.name = "a/b".into()), "system name"),
            (Box::new(|c| c.system.endpoints.clear()), "no endpoints"),
            (
                Box::new(|c| c.tenants[0].principal = "EVERYONE@".into()),
                "principal",
            ),
            (
                Box::new(|c| c.tenants[0].principal = "team".into()),
                "principal",
            ),
            (
                Box::new(|c| c.tenants[0].allowed_pools = vec!["x".into()]),
                "not in pools",
            ),
            (
                Box::new(|c| c.tenants[0].allowed_pools.clear()),
                "no allowedPools",
            ),
            (
                Box::new(|c| c.tenants[1].namespaces.push("ns-a".into())),
                "belongs to tenants",
            ),
            (Box::new(|c| c.tenants[1].name = "a".into()), "twice"),
            (
                Box::new(|c| c.default_tenant = Some("z".into())),
                "default tenant",
            ),
            (
                Box::new(|c| c.tenants[0].namespaces.push("Bad_NS".into())),
                "namespace name",
            ),
            (Box::new(|c| c.tenants[0].uid = Some(0)), "system account"),
            (
                Box::new(|c| {
                    c.tenants[0].uid = Some(20001);
                    c.tenants[1].uid = Some(20001);
                }),
                "the same uid 20001",
            ),
        ];
        for (change, want) in cases {
            let mut c = config();
            change(&mut c);
            let err = StaticDirectory::new(c).unwrap_err();
            assert!(err.0.contains(want), "{err} (wanted {want:?})");
        }
    }

    #[tokio::test]
    async fn a_daos_system_needs_daos_libraries() {
        let mut c = config();
        assert_eq!(
            StaticDirectory::new(c.clone())
                .unwrap()
                .system("daos_server")
                .await
                .unwrap()
                .volumes,
            VolumeAccess::Engine {
                data_endpoint: None
            }
        );
        c.system.backend = DaosBackend::Daos;
        let err = StaticDirectory::new(c.clone()).unwrap_err();
        assert!(err.0.contains("--daos-lib"), "{err}");
        // A directory without libdaos is named in the refusal.
        let empty = tempfile::tempdir().unwrap();
        let err = StaticDirectory::open(c, Some(empty.path())).unwrap_err();
        assert!(err.0.contains("libdfs.so"), "{err}");
    }

    #[test]
    fn principals() {
        assert!(valid_tenant_principal("team-a@"));
        assert!(valid_tenant_principal("svc$@example.com"));
        for bad in ["", "@", "team", "OWNER@", "a b@", "a@b@", "a:b@"] {
            assert!(!valid_tenant_principal(bad), "{bad}");
        }
    }
}
