//! The sample manifests: every valid one passes the schema and the CEL rules,
//! every invalid one fails with the message recorded on its first line
//! (`# expect: ...`). Files in invalid/ with two documents are updates: the
//! first is the stored object, the second the update that must fail.

use crate::support::Api;
use dpufs_api::{ByteQuantity, DaosContainer, DaosPool, DaosSystem, DaosTenant, DeletionPolicy};
use dpufs_e2e::manifests::{
    documents, invalid_sample_files, offline_expectation, valid_dpufs_samples,
};
use serde_json::{Value, json};

fn samples() -> Vec<Value> {
    valid_dpufs_samples()
}

/// The valid sample of `kind` with this `metadata.name`.
fn sample(kind: &str, name: &str) -> Value {
    samples()
        .into_iter()
        .find(|s| s["kind"] == kind && s["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no sample {kind}/{name}"))
}

/// Deserializes into the Rust type of the object's kind.
fn typed(object: &Value) -> Result<(), serde_json::Error> {
    let o = object.clone();
    match object["kind"].as_str().unwrap() {
        "DaosSystem" => serde_json::from_value::<DaosSystem>(o).map(drop),
        "DaosPool" => serde_json::from_value::<DaosPool>(o).map(drop),
        "DaosContainer" => serde_json::from_value::<DaosContainer>(o).map(drop),
        "DaosTenant" => serde_json::from_value::<DaosTenant>(o).map(drop),
        other => panic!("unexpected kind {other}"),
    }
}

#[test]
fn valid_samples_pass_schema_and_cel() {
    let api = Api::new();
    let samples = samples();
    for kind in ["DaosSystem", "DaosPool", "DaosContainer", "DaosTenant"] {
        assert!(
            samples.iter().any(|s| s["kind"] == kind),
            "no {kind} sample"
        );
    }
    for object in &samples {
        let name = format!("{}/{}", object["kind"], object["metadata"]["name"]);
        assert_eq!(
            api.check(object, None),
            Vec::<String>::new(),
            "{name} on create"
        );
        // Re-applying an unchanged object passes the transition rules too.
        assert_eq!(
            api.check(object, Some(object)),
            Vec::<String>::new(),
            "{name} on update"
        );
        typed(object).unwrap_or_else(|e| panic!("{name} does not deserialize: {e}"));
    }
}

#[test]
fn invalid_samples_fail_with_their_message() {
    let api = Api::new();
    let files = invalid_sample_files();
    assert!(files.len() >= 40, "only {} invalid samples", files.len());
    let mut failures = Vec::new();
    for path in files {
        let expected = offline_expectation(&path);
        let docs = documents(&path);
        let problems = match docs.as_slice() {
            [object] => api.check(object, None),
            [old, new] => {
                let stored = api.check(old, None);
                assert!(
                    stored.is_empty(),
                    "{}: stored object: {stored:?}",
                    path.display()
                );
                api.check(new, Some(old))
            }
            _ => panic!(
                "{}: one object, or a stored object and its update",
                path.display()
            ),
        };
        // The sample breaks the rule it is about, and nothing about other fields.
        let field = |problem: &str| problem.split(": ").next().unwrap_or_default().to_string();
        let hit = problems.iter().find(|p| p.contains(&expected));
        if !hit.is_some_and(|hit| problems.iter().all(|p| field(p) == field(hit))) {
            failures.push(format!(
                "{}: expected errors about one field, one containing {expected:?}; got {problems:#?}",
                path.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Applies `changes` (JSON pointer, new value; null removes) to a copy.
fn changed(object: &Value, changes: &[(&str, Value)]) -> Value {
    let mut new = object.clone();
    for (pointer, value) in changes {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        let parent = new.pointer_mut(parent).unwrap().as_object_mut().unwrap();
        if value.is_null() {
            parent.remove(key);
        } else {
            parent.insert(key.to_string(), value.clone());
        }
    }
    new
}

#[test]
fn mutable_fields_can_change() {
    let api = Api::new();
    let cases = [
        (
            sample("DaosSystem", "daos-prod"),
            vec![
                ("/spec/endpoints", json!(["10.0.0.9:10001"])),
                // An engine restarted elsewhere: nodes mount from the new address.
                ("/spec/dataEndpoint", json!("[fd00::9]:7001")),
            ],
        ),
        (
            sample("DaosPool", "training"),
            vec![
                ("/spec/deletionPolicy", json!("Delete")),
                ("/spec/properties/redundancyFactor", json!(3)),
                ("/spec/properties/selfHeal", json!([])),
                ("/spec/acl", json!(["A::OWNER@:rw"])),
            ],
        ),
        (
            sample("DaosContainer", "datasets"),
            vec![
                ("/spec/capacity", json!("30Ti")),
                ("/spec/owner", json!("team-a@")),
                ("/spec/acl", Value::Null),
                ("/spec/deletionPolicy", json!("Delete")),
            ],
        ),
        (
            sample("DaosTenant", "team-a"),
            vec![
                ("/spec/allowedPools", json!(["training", "scratch"])),
                ("/spec/namespaces", json!(["team-a"])),
                ("/spec/limits", Value::Null),
            ],
        ),
    ];
    for (old, changes) in cases {
        let new = changed(&old, &changes);
        assert_eq!(
            api.check(&new, Some(&old)),
            Vec::<String>::new(),
            "{changes:?}"
        );
    }
}

#[test]
fn a_tenant_uid_may_be_added_but_never_removed() {
    let api = Api::new();
    let fixed = sample("DaosTenant", "team-a");
    let unset = changed(&fixed, &[("/spec/uid", Value::Null)]);
    assert_eq!(api.check(&fixed, Some(&unset)), Vec::<String>::new());
    let refused = api.check(&unset, Some(&fixed));
    assert!(
        refused
            .iter()
            .any(|m| m.contains("uid cannot be changed or removed")),
        "{refused:?}"
    );
}

#[test]
fn deletion_policy_defaults_to_retain() {
    let pool = changed(
        &sample("DaosPool", "training"),
        &[("/spec/deletionPolicy", Value::Null)],
    );
    let pool: DaosPool = serde_json::from_value(pool).unwrap();
    assert_eq!(pool.spec.deletion_policy, DeletionPolicy::Retain);
    let crd = serde_json::to_value(dpufs_api::crds()).unwrap();
    let schema = &crd[1]["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    assert_eq!(
        schema["properties"]["spec"]["properties"]["deletionPolicy"]["default"],
        "Retain"
    );
}

/// The CEL format rule on byte sizes and the Rust parser the controllers use
/// accept the same strings.
#[test]
fn byte_size_rule_agrees_with_the_parser() {
    let api = Api::new();
    let pool = sample("DaosPool", "training");
    for text in [
        "1", "1048576", "10Ti", "1.5Gi", "500G", "2.25T", "7Ei", "1k", "1.5", "1K", "1KB", "1e6",
        "-1", "+1", "0.5Mi", ".5Mi", "1.Mi", "1m", "1 Gi", "Gi", "",
    ] {
        let object = changed(&pool, &[("/spec/size/totalBytes", json!(text))]);
        let problems = api.check(&object, None);
        let rule_accepts = !problems.iter().any(|p| p.contains("is not a byte size"));
        let parser_accepts = ByteQuantity::Quantity(text.to_string()).bytes().is_ok();
        assert_eq!(rule_accepts, parser_accepts, "{text:?}: {problems:?}");
    }
    let object = changed(&pool, &[("/spec/size/totalBytes", json!(1099511627776u64))]);
    assert_eq!(
        api.check(&object, None),
        Vec::<String>::new(),
        "a plain integer"
    );
}
