//! The Identity service, on the controller endpoint and on the node endpoint.

use super::Runner;
use super::support::{Answer, Check, Ctx, ensure, fail, skip};
use dpufs_proto::csi::v1::identity_client::IdentityClient;
use dpufs_proto::csi::v1::plugin_capability::{self, service, volume_expansion};
use dpufs_proto::csi::v1::{self as csi};
use tonic::transport::Channel;

#[derive(Clone, Copy, Debug)]
enum Which {
    Controller,
    Node,
}

impl Which {
    fn client(self, cx: &Ctx) -> Result<IdentityClient<Channel>, super::support::Verdict> {
        match self {
            Which::Controller => Ok(cx.ctl_ident.clone()),
            Which::Node => match &cx.node_ident {
                Some(c) => Ok(c.clone()),
                None => skip(format!("no node endpoint: {}", cx.cfg.node_absent_reason)),
            },
        }
    }
}

pub(super) async fn cases(r: &mut Runner) {
    for (label, which) in [("controller", Which::Controller), ("node", Which::Node)] {
        r.case(
            &format!("Identity ({label} endpoint): GetPluginInfo returns a valid name and a vendor version"),
            move |cx| plugin_info(cx, which),
        )
        .await;
        r.case(
            &format!(
                "Identity ({label} endpoint): GetPluginCapabilities lists known capabilities only"
            ),
            move |cx| plugin_capabilities(cx, which),
        )
        .await;
        r.case(
            &format!("Identity ({label} endpoint): Probe answers OK"),
            move |cx| probe(cx, which),
        )
        .await;
    }
    r.case(
        "Identity: both endpoints serve the same plugin (name and vendor version)",
        same_plugin,
    )
    .await;
}

/// A name as CSI wants it: at most 63 characters, alphanumerics at both ends, alphanumerics,
/// `-` and `.` between.
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'.')
}

async fn plugin_info(cx: Ctx, which: Which) -> Check {
    let info = which
        .client(&cx)?
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .expect_ok("GetPluginInfo")?;
    ensure!(
        valid_name(&info.name),
        "GetPluginInfo name {:?}: CSI wants 1-63 characters of [a-zA-Z0-9.-], alphanumeric at both ends",
        info.name
    );
    ensure!(
        !info.vendor_version.is_empty(),
        "GetPluginInfo has an empty vendor_version (REQUIRED)"
    );
    Ok(())
}

async fn plugin_capabilities(cx: Ctx, which: Which) -> Check {
    let caps = which
        .client(&cx)?
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .expect_ok("GetPluginCapabilities")?
        .capabilities;
    for cap in &caps {
        match &cap.r#type {
            Some(plugin_capability::Type::Service(s)) => match service::Type::try_from(s.r#type) {
                Ok(service::Type::Unknown) | Err(_) => {
                    fail!("GetPluginCapabilities: unknown service type {}", s.r#type)
                }
                Ok(_) => {}
            },
            Some(plugin_capability::Type::VolumeExpansion(e)) => {
                match volume_expansion::Type::try_from(e.r#type) {
                    Ok(volume_expansion::Type::Unknown) | Err(_) => {
                        fail!(
                            "GetPluginCapabilities: unknown volume expansion type {}",
                            e.r#type
                        )
                    }
                    Ok(_) => {}
                }
            }
            None => fail!("GetPluginCapabilities: a capability with no type: {cap:?}"),
        }
    }
    Ok(())
}

async fn probe(cx: Ctx, which: Which) -> Check {
    // `ready` may be unset, true, or false while the plugin initializes: all are answers.
    which
        .client(&cx)?
        .probe(csi::ProbeRequest {})
        .await
        .expect_ok("Probe")?;
    Ok(())
}

async fn same_plugin(cx: Ctx) -> Check {
    let node = Which::Node.client(&cx)?;
    let a = cx
        .ctl_ident
        .clone()
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .expect_ok("GetPluginInfo (controller)")?;
    let b = node
        .clone()
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .expect_ok("GetPluginInfo (node)")?;
    ensure!(
        (a.name.as_str(), a.vendor_version.as_str())
            == (b.name.as_str(), b.vendor_version.as_str()),
        "the controller endpoint is {} {}, the node endpoint {} {}",
        a.name,
        a.vendor_version,
        b.name,
        b.vendor_version
    );
    Ok(())
}
