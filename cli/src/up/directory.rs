//! The CSI plugins' directory for the stack: the static directory file (`--directory`) that
//! tells `dpufs-csi controller` and `dpufs-csi node` where the DAOS system is, which pools
//! there are and who the tenants are (docs/csi.md, "Directory"). Without Kubernetes, the
//! stack serves one tenant, `default`, which is also the tenant of requests that carry no PVC
//! namespace (as conformance suites send), in the one pool `default`.

use super::provision::DEFAULT_LABEL;
use super::state::StateDir;
use anyhow::Context;
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The DAOS principal the default tenant's containers are granted to.
const TENANT_PRINCIPAL: &str = "default@";

/// What the directory describes.
#[derive(Debug)]
pub struct Layout<'a> {
    pub system: &'a str,
    /// The management endpoint, `host:port`.
    pub endpoint: &'a str,
    /// The engine's fabric data service, where workers mount volumes.
    pub data_endpoint: Option<SocketAddr>,
    /// The default pool's UUID.
    pub pool: &'a str,
}

impl Layout<'_> {
    /// The directory file's content, in the static directory's format.
    fn to_json(&self) -> serde_json::Value {
        let mut system = json!({"name": self.system, "endpoints": [self.endpoint]});
        if let Some(data) = self.data_endpoint {
            system["dataEndpoint"] = json!(data.to_string());
        }
        json!({
            "system": system,
            "pools": {DEFAULT_LABEL: self.pool},
            "tenants": [{
                "name": DEFAULT_LABEL,
                "principal": TENANT_PRINCIPAL,
                "namespaces": [DEFAULT_LABEL],
                "allowedPools": [DEFAULT_LABEL],
            }],
            "defaultTenant": DEFAULT_LABEL,
        })
    }
}

/// Writes `<state>/directory.json`; its path.
pub fn write(state: &StateDir, layout: &Layout) -> anyhow::Result<PathBuf> {
    let path = state.path("directory.json");
    let text = serde_json::to_string_pretty(&layout.to_json())?;
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_pool_tenant_and_data_endpoint() {
        let layout = Layout {
            system: "daos_server",
            endpoint: "127.0.0.1:10001",
            data_endpoint: Some("127.0.0.1:20002".parse().unwrap()),
            pool: "6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f",
        };
        let v = layout.to_json();
        assert_eq!(v["system"]["dataEndpoint"], "127.0.0.1:20002");
        assert_eq!(v["pools"]["default"], layout.pool);
        assert_eq!(v["defaultTenant"], "default");
        assert_eq!(v["tenants"][0]["allowedPools"][0], "default");
        let without = Layout {
            data_endpoint: None,
            ..layout
        };
        assert!(without.to_json()["system"].get("dataEndpoint").is_none());
    }
}
