//! Which namespaces belong to a DaosTenant, as the operator reports them in
//! the tenant's status and as the CSI driver decides a volume's tenant: the
//! namespaces of `spec.namespaces`, or those whose labels match
//! `spec.namespaceSelector` (Kubernetes's `LabelSelector` semantics);
//! namespaces being deleted belong to no tenant.

use dpufs_api::DaosTenantSpec;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// What tenancy needs of a Namespace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NamespaceView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `metadata.deletionTimestamp` is set: the namespace is going away.
    pub deleting: bool,
}

impl From<&Namespace> for NamespaceView {
    fn from(ns: &Namespace) -> NamespaceView {
        NamespaceView {
            name: ns.name_any(),
            labels: ns.labels().clone(),
            deleting: ns.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// A `matchExpressions` requirement the API server would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("namespaceSelector.matchExpressions[{index}]: operator {operator} needs values")]
    NeedsValues { index: usize, operator: String },
    #[error("namespaceSelector.matchExpressions[{index}]: operator {operator} takes no values")]
    TakesNoValues { index: usize, operator: String },
    #[error(
        "namespaceSelector.matchExpressions[{index}]: unknown operator {operator:?}; use In, NotIn, Exists or DoesNotExist"
    )]
    UnknownOperator { index: usize, operator: String },
}

/// Whether `labels` match `selector`, with Kubernetes's semantics: every
/// `matchLabels` pair and every `matchExpressions` requirement must hold; an
/// empty selector matches everything. An invalid selector (unknown operator,
/// `In`/`NotIn` without values, `Exists`/`DoesNotExist` with values) is an
/// error, as the API server would report it.
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let mut matches = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    for (index, req) in selector.match_expressions.iter().flatten().enumerate() {
        let values = req.values.as_deref().unwrap_or_default();
        let value = labels.get(&req.key);
        let operator = || req.operator.clone();
        // Every requirement is checked, so that an invalid one is reported
        // whatever the labels are.
        let holds = match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(SelectorError::NeedsValues {
                    index,
                    operator: operator(),
                });
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(SelectorError::TakesNoValues {
                    index,
                    operator: operator(),
                });
            }
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => {
                return Err(SelectorError::UnknownOperator {
                    index,
                    operator: operator(),
                });
            }
        };
        matches &= holds;
    }
    Ok(matches)
}

/// Whether `ns` belongs to the tenant of `spec`: it is not being deleted and
/// is named in `namespaces`, or (without `namespaces`) its labels match
/// `namespaceSelector`.
pub fn tenant_claims(spec: &DaosTenantSpec, ns: &NamespaceView) -> Result<bool, SelectorError> {
    if ns.deleting {
        return Ok(false);
    }
    match (&spec.namespaces, &spec.namespace_selector) {
        (Some(names), _) => Ok(names.contains(&ns.name)),
        (None, Some(selector)) => selector_matches(selector, &ns.labels),
        (None, None) => Ok(false),
    }
}

/// The namespaces of a tenant now, sorted: those of `namespaces` (the ones
/// that exist) that [`tenant_claims`].
pub fn matched_namespaces(
    spec: &DaosTenantSpec,
    namespaces: &[NamespaceView],
) -> Result<Vec<String>, SelectorError> {
    let mut out = Vec::new();
    for ns in namespaces {
        if tenant_claims(spec, ns)? {
            out.push(ns.name.clone());
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Why a principal is unusable as a tenant's, if it is: the API server's
/// rules (`name@` or `name@domain`, not a special principal), checked again
/// for objects written before the CRD had them.
pub fn principal_problem(principal: &str) -> Option<String> {
    let not_a_principal = || {
        Some(format!(
            "principal {principal:?} is not a DAOS principal: write the user name followed by @, for example team-a@"
        ))
    };
    let Some((name, domain)) = principal.split_once('@') else {
        return not_a_principal();
    };
    let bad = |s: &str| s.contains([':', '@', ' ']);
    if name.is_empty() || bad(name) || bad(domain) || principal.len() > 256 {
        return not_a_principal();
    }
    if matches!(principal, "OWNER@" | "GROUP@" | "EVERYONE@") {
        return Some(format!(
            "{principal} is a special DAOS principal; name the tenant user, for example team-a@"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ns(name: &str, pairs: &[(&str, &str)]) -> NamespaceView {
        NamespaceView {
            name: name.into(),
            labels: labels(pairs),
            deleting: false,
        }
    }

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn spec(v: serde_json::Value) -> DaosTenantSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn selectors_follow_kubernetes_semantics() {
        let l = labels(&[("tenant", "a"), ("env", "prod")]);
        let sel = |ml: &[(&str, &str)], me: Vec<LabelSelectorRequirement>| LabelSelector {
            match_labels: (!ml.is_empty()).then(|| labels(ml)),
            match_expressions: (!me.is_empty()).then_some(me),
        };
        assert_eq!(
            selector_matches(&sel(&[], vec![]), &l),
            Ok(true),
            "empty matches all"
        );
        assert_eq!(
            selector_matches(&sel(&[("tenant", "a")], vec![]), &l),
            Ok(true)
        );
        assert_eq!(
            selector_matches(&sel(&[("tenant", "b")], vec![]), &l),
            Ok(false)
        );
        let cases = [
            (req("env", "In", &["prod", "dev"]), true),
            (req("env", "In", &["dev"]), false),
            (req("env", "NotIn", &["dev"]), true),
            (req("missing", "NotIn", &["x"]), true),
            (req("env", "NotIn", &["prod"]), false),
            (req("env", "Exists", &[]), true),
            (req("missing", "Exists", &[]), false),
            (req("missing", "DoesNotExist", &[]), true),
            (req("env", "DoesNotExist", &[]), false),
        ];
        for (r, want) in cases {
            let s = sel(&[("tenant", "a")], vec![r.clone()]);
            assert_eq!(selector_matches(&s, &l), Ok(want), "{r:?}");
        }
        let bad = [
            (req("env", "In", &[]), "operator In needs values"),
            (
                req("env", "Exists", &["x"]),
                "operator Exists takes no values",
            ),
            (
                req("env", "Equals", &["prod"]),
                "unknown operator \"Equals\"",
            ),
        ];
        for (r, message) in bad {
            // Invalid whatever the labels: even behind a failing matchLabels.
            let s = sel(
                &[("tenant", "b")],
                vec![req("env", "Exists", &[]), r.clone()],
            );
            let e = selector_matches(&s, &l).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("namespaceSelector.matchExpressions[1]: ")
                    && e.to_string().contains(message),
                "{r:?}: {e}"
            );
        }
    }

    #[test]
    fn named_namespaces_are_those_that_exist() {
        let s = spec(serde_json::json!({
            "namespaces": ["b", "a", "gone"], "allowedPools": ["p"], "principal": "t@"
        }));
        let mut dying = ns("c", &[]);
        dying.deleting = true;
        let all = [ns("a", &[]), ns("b", &[]), ns("x", &[]), dying];
        assert_eq!(matched_namespaces(&s, &all).unwrap(), vec!["a", "b"]);
    }

    #[test]
    fn selected_namespaces_match_labels_and_skip_deleting_ones() {
        let s = spec(serde_json::json!({
            "namespaceSelector": {"matchLabels": {"dpufs.io/tenant": "r"}},
            "allowedPools": ["p"], "principal": "t@"
        }));
        let mut dying = ns("c", &[("dpufs.io/tenant", "r")]);
        dying.deleting = true;
        let all = [
            ns("b", &[("dpufs.io/tenant", "r")]),
            ns("a", &[("dpufs.io/tenant", "r"), ("x", "y")]),
            ns("other", &[("dpufs.io/tenant", "s")]),
            dying.clone(),
        ];
        assert_eq!(matched_namespaces(&s, &all).unwrap(), vec!["a", "b"]);
        assert_eq!(tenant_claims(&s, &all[0]), Ok(true));
        assert_eq!(tenant_claims(&s, &all[2]), Ok(false));
        assert_eq!(tenant_claims(&s, &dying), Ok(false), "going away");
    }

    #[test]
    fn names_win_over_labels_and_an_invalid_selector_claims_nothing() {
        let named = spec(serde_json::json!({
            "namespaces": ["a"], "allowedPools": ["p"], "principal": "t@"
        }));
        assert_eq!(tenant_claims(&named, &ns("a", &[])), Ok(true));
        assert_eq!(
            tenant_claims(&named, &ns("b", &[("dpufs.io/tenant", "t")])),
            Ok(false)
        );
        let invalid = spec(serde_json::json!({
            "namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]},
            "allowedPools": ["p"], "principal": "t@"
        }));
        assert!(matches!(
            tenant_claims(&invalid, &ns("a", &[("k", "v")])),
            Err(SelectorError::NeedsValues { index: 0, .. })
        ));
        assert_eq!(
            matched_namespaces(&invalid, &[]),
            Ok(vec![]),
            "no namespace, nothing to report"
        );
    }

    #[test]
    fn principals() {
        assert_eq!(principal_problem("team-a@"), None);
        assert_eq!(principal_problem("alice@example.com"), None);
        for bad in ["OWNER@", "team", "a:b@", "@", "a@b@"] {
            assert!(principal_problem(bad).is_some(), "{bad}");
        }
        assert!(principal_problem("EVERYONE@").unwrap().contains("special"));
    }
}
