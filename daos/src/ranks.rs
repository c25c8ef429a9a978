//! Rank control of the embedded engine (real DAOS: `dmg system stop/start`).

use crate::error::Result;
use crate::mgmt::MgmtClient;
use crate::session::Session;
use dpufs_proto::engine::v1::{RankReq, rank_control_client::RankControlClient};
use std::sync::Arc;

/// Stops and starts the engine's simulated ranks.
#[derive(Debug, Clone)]
pub struct EngineRanks {
    session: Arc<Session>,
}

impl EngineRanks {
    /// Rank control on the engine the management client talks to.
    pub fn new(mgmt: &MgmtClient) -> EngineRanks {
        EngineRanks {
            session: mgmt.session(),
        }
    }

    /// Stops a rank; returns its state name afterwards.
    pub async fn stop(&self, rank: u32) -> Result<String> {
        let timeout = self.session.cfg.request_timeout;
        let resp = self
            .session
            .call(timeout, RankReq { rank }, |ch, r, _| async move {
                RankControlClient::new(ch).rank_stop(r).await
            })
            .await?;
        Ok(resp.state)
    }

    /// Starts a stopped rank; returns its state name afterwards.
    pub async fn start(&self, rank: u32) -> Result<String> {
        let timeout = self.session.cfg.request_timeout;
        let resp = self
            .session
            .call(timeout, RankReq { rank }, |ch, r, _| async move {
                RankControlClient::new(ch).rank_start(r).await
            })
            .await?;
        Ok(resp.state)
    }
}
