//! How the shim reaches its DPU's agent: at `--dpu-agent HOST:PORT`, or at the InternalIP of
//! the Node labelled `provisioning.dpu.nvidia.com/host=<this host>` ([`crate::dpu::pairing`])
//! on `--dpu-agent-port`. The address is looked up at the first call that needs it (the DPU
//! may join its cluster after the host), then kept; the channel reconnects by itself.

use super::error::ShimError;
use crate::dpu::{pairing, tls};
use dpufs_proto::dpu::v1::dpu_agent_client::DpuAgentClient;
use openssl::ssl::SslConnector;
use tokio::sync::OnceCell;
use tonic::transport::Channel;

/// Where the agent is.
#[derive(Clone)]
pub enum AgentAddress {
    /// `--dpu-agent HOST:PORT`.
    Given(String),
    /// The paired DPU's Node, found through the API server.
    Paired {
        kube: kube::Client,
        host: String,
        port: u16,
    },
}

/// The shim's connection to its agent.
pub struct AgentLink {
    address: AgentAddress,
    connector: SslConnector,
    server_name: Option<String>,
    client: OnceCell<DpuAgentClient<Channel>>,
}

impl std::fmt::Debug for AgentAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentAddress::Given(a) => write!(f, "{a}"),
            AgentAddress::Paired { host, port, .. } => write!(f, "the DPU of {host}, port {port}"),
        }
    }
}

impl std::fmt::Debug for AgentLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentLink")
            .field("address", &self.address)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl AgentLink {
    pub fn new(
        address: AgentAddress,
        connector: SslConnector,
        server_name: Option<String>,
    ) -> AgentLink {
        AgentLink {
            address,
            connector,
            server_name,
            client: OnceCell::new(),
        }
    }

    /// A client of the agent.
    pub async fn client(&self) -> Result<DpuAgentClient<Channel>, ShimError> {
        self.client
            .get_or_try_init(|| async {
                let addr = match &self.address {
                    AgentAddress::Given(a) => a.clone(),
                    AgentAddress::Paired { kube, host, port } => {
                        let ip = pairing::dpu_address_of(kube, host)
                            .await
                            .map_err(|e| ShimError::Unreachable(e.to_string()))?;
                        std::net::SocketAddr::new(ip, *port).to_string()
                    }
                };
                tracing::info!(agent = %addr, "the DPU agent");
                let channel =
                    tls::channel(self.connector.clone(), &addr, self.server_name.as_deref())
                        .map_err(ShimError::Unreachable)?;
                Ok(DpuAgentClient::new(channel))
            })
            .await
            .cloned()
    }
}
