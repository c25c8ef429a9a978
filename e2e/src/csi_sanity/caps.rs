//! What the driver advertises: its plugin, Controller and Node capabilities, learnt once
//! before the first case.

use super::support::{Ctx, describe};
use dpufs_proto::csi::v1::plugin_capability::service::Type as PluginCap;
use dpufs_proto::csi::v1::{self as csi, controller_service_capability};
use dpufs_proto::csi::v1::{node_service_capability, plugin_capability};
use std::collections::HashSet;

/// What the driver advertises.
#[derive(Debug, Default)]
pub(crate) struct Caps {
    /// The controller endpoint's Identity lists CONTROLLER_SERVICE.
    pub controller_service: bool,
    /// Why the plugin capabilities are unknown, when GetPluginCapabilities failed.
    pub plugin_error: Option<String>,
    /// ControllerGetCapabilities.
    pub controller: HashSet<i32>,
    /// NodeGetCapabilities.
    pub node: HashSet<i32>,
    /// The node endpoint's Identity lists VOLUME_ACCESSIBILITY_CONSTRAINTS.
    pub node_topology: bool,
}

fn plugin_services(caps: &[csi::PluginCapability]) -> HashSet<i32> {
    caps.iter()
        .filter_map(|c| match &c.r#type {
            Some(plugin_capability::Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect()
}

impl Caps {
    pub(crate) async fn learn(cx: &Ctx) -> Caps {
        let mut caps = Caps::default();
        match cx
            .ctl_ident
            .clone()
            .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
            .await
        {
            Ok(r) => {
                let services = plugin_services(&r.into_inner().capabilities);
                caps.controller_service = services.contains(&(PluginCap::ControllerService as i32));
            }
            Err(s) => caps.plugin_error = Some(describe(&s)),
        }
        if caps.controller_service
            && let Ok(r) = cx
                .ctl
                .clone()
                .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
                .await
        {
            caps.controller = r
                .into_inner()
                .capabilities
                .iter()
                .filter_map(|c| {
                    c.r#type
                        .as_ref()
                        .map(|controller_service_capability::Type::Rpc(rpc)| rpc.r#type)
                })
                .collect();
        }
        if let Some(node) = &cx.node
            && let Ok(r) = node
                .clone()
                .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
                .await
        {
            caps.node = r
                .into_inner()
                .capabilities
                .iter()
                .filter_map(|c| {
                    c.r#type
                        .as_ref()
                        .map(|node_service_capability::Type::Rpc(rpc)| rpc.r#type)
                })
                .collect();
        }
        if let Some(ident) = &cx.node_ident
            && let Ok(r) = ident
                .clone()
                .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
                .await
        {
            let services = plugin_services(&r.into_inner().capabilities);
            caps.node_topology =
                services.contains(&(PluginCap::VolumeAccessibilityConstraints as i32));
        }
        caps
    }
}
