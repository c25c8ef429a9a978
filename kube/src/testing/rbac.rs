//! What a component of ours asks of the API server, recorded by the fake
//! ([`super::FakeApiServer::client_as`]), against what the chart grants it: the list
//! `tools/chart/api-calls.yaml`, which `tools/chart/check.py` compares with the chart's roles
//! both ways. A call the code makes that the list lacks fails the test that made it, so the
//! chart's RBAC follows the code.

use super::Target;
use http::Method;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// One kind of call: who, which verb, on which resource (`plural` or `plural/status`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ApiCall {
    pub user: String,
    pub group: String,
    pub resource: String,
    pub verb: String,
}

impl ApiCall {
    pub(super) fn of(user: &str, method: &Method, t: &Target, watch: bool) -> ApiCall {
        let verb = match (method.as_str(), t.named) {
            ("GET", false) if watch => "watch",
            ("GET", false) => "list",
            ("GET", true) => "get",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            (other, _) => other,
        };
        let resource = if t.status {
            format!("{}/status", t.key.plural)
        } else {
            t.key.plural.clone()
        };
        ApiCall {
            user: user.to_string(),
            group: t.key.group.clone(),
            resource,
            verb: verb.to_ascii_lowercase(),
        }
    }
}

#[derive(Deserialize)]
struct Calls {
    components: BTreeMap<String, Component>,
}

#[derive(Deserialize)]
struct Component {
    calls: Vec<Granted>,
}

#[derive(Deserialize)]
struct Granted {
    group: String,
    resource: String,
    verbs: Vec<String>,
}

/// `(group, resource, verb)` of every call `tools/chart/api-calls.yaml` lists for `component`.
pub fn granted(component: &str) -> BTreeSet<(String, String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/chart/api-calls.yaml");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let calls: Calls = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let Some(c) = calls.components.get(component) else {
        panic!("{path} lists no component {component:?}");
    };
    c.calls
        .iter()
        .flat_map(|g| {
            g.verbs
                .iter()
                .map(|v| (g.group.clone(), g.resource.clone(), v.clone()))
        })
        .collect()
}

/// Panics, naming each, when `calls` holds a call the chart does not grant `component`.
pub fn assert_granted(calls: &BTreeSet<ApiCall>, component: &str) {
    let granted = granted(component);
    let missing: Vec<String> = calls
        .iter()
        .filter(|c| !granted.contains(&(c.group.clone(), c.resource.clone(), c.verb.clone())))
        .map(|c| format!("{} {} (group {:?})", c.verb, c.resource, c.group))
        .collect();
    assert!(
        missing.is_empty(),
        "{component} made API calls tools/chart/api-calls.yaml (and so the chart's RBAC) does \
         not grant it: {}; add them there and to charts/dpufs/templates/rbac.yaml",
        missing.join(", ")
    );
}
