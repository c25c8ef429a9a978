//! Which host a DPU serves, and which DPU serves a host, the way NVIDIA's DOCA Platform
//! Framework records it: the DPU's own Kubernetes Node carries the label
//! `provisioning.dpu.nvidia.com/host=<host node name>`. The agent reads its own Node's label
//! (unless `--host-node` says it); the shim lists the Nodes labelled with its host's name.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

/// DPF's pairing label on a DPU's Node: the name of its host's Node.
pub const HOST_LABEL: &str = "provisioning.dpu.nvidia.com/host";

/// Why a pairing could not be found.
#[derive(Debug, thiserror::Error)]
pub enum PairingError {
    #[error("the DPU's Node {0:?} does not exist")]
    NoDpuNode(String),
    #[error("the DPU's Node {0:?} has no label {HOST_LABEL} naming its host (or pass --host-node)")]
    Unlabelled(String),
    #[error("no Node is labelled {HOST_LABEL}={0} (a DPU paired with this host); pass --dpu-agent")]
    NoDpu(String),
    #[error(
        "several Nodes are labelled {HOST_LABEL}={host} ({}); pass --dpu-agent to choose the DPU whose agent this host uses",
        .dpus.join(", ")
    )]
    SeveralDpus { host: String, dpus: Vec<String> },
    #[error("the DPU's Node {0:?} has no InternalIP address to reach its agent at")]
    NoAddress(String),
    #[error("reading Nodes from the Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// The host the DPU `dpu_node` is paired with: its label.
pub async fn host_of(client: &kube::Client, dpu_node: &str) -> Result<String, PairingError> {
    let node = Api::<Node>::all(client.clone())
        .get_opt(dpu_node)
        .await?
        .ok_or_else(|| PairingError::NoDpuNode(dpu_node.to_string()))?;
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HOST_LABEL))
        .filter(|h| !h.is_empty())
        .cloned()
        .ok_or_else(|| PairingError::Unlabelled(dpu_node.to_string()))
}

/// The address of the one DPU paired with `host`: its Node's InternalIP.
pub async fn dpu_address_of(
    client: &kube::Client,
    host: &str,
) -> Result<std::net::IpAddr, PairingError> {
    let selector = format!("{HOST_LABEL}={host}");
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await?;
    // The selector is checked here too: the label is what decides, whatever the server did
    // with the selector.
    let dpus: Vec<Node> = nodes
        .items
        .into_iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(HOST_LABEL))
                .is_some_and(|h| h == host)
        })
        .collect();
    let names = || {
        dpus.iter()
            .map(|n| n.metadata.name.clone().unwrap_or_default())
            .collect::<Vec<_>>()
    };
    let dpu = match dpus.as_slice() {
        [] => return Err(PairingError::NoDpu(host.to_string())),
        [one] => one,
        _ => {
            return Err(PairingError::SeveralDpus {
                host: host.to_string(),
                dpus: names(),
            });
        }
    };
    let name = dpu.metadata.name.clone().unwrap_or_default();
    dpu.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .and_then(|a| a.address.parse().ok())
        .ok_or(PairingError::NoAddress(name))
}
