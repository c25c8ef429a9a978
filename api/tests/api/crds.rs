//! The generated CRDs: kept in manifests/crds/, structural, named as the
//! design says, and with CEL rules that compile within the cost budget.

use dpufs_e2e::manifests::{repo, yaml_files};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::cel::{ScopeContext, analyze_rule, compile_schema};
use serde_json::Value;

fn schema(crd: &CustomResourceDefinition) -> Value {
    let version = &crd.spec.versions[0];
    serde_json::to_value(
        version
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

/// Calls `f(path, node)` on every schema node.
fn walk(path: &str, node: &Value, f: &mut impl FnMut(&str, &Value)) {
    f(path, node);
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            walk(&format!("{path}.{name}"), child, f);
        }
    }
    if let Some(items) = node.get("items") {
        walk(&format!("{path}[*]"), items, f);
    }
    if let Some(additional) = node.get("additionalProperties").filter(|v| v.is_object()) {
        walk(&format!("{path}{{*}}"), additional, f);
    }
}

#[test]
fn manifests_crds_are_up_to_date() {
    let dir = repo().join("manifests/crds");
    let expected = dpufs_api::crd_manifests().unwrap();
    let hint = "regenerate with `cargo run -p dpufs-operator -- crds --out manifests/crds`";
    for (file, yaml) in &expected {
        let path = dir.join(file);
        let on_disk = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; {hint}", path.display()));
        assert!(
            on_disk == *yaml,
            "{} differs from the CRD the code generates; {hint}",
            path.display()
        );
    }
    let mut names: Vec<String> = yaml_files(&dir)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut generated: Vec<String> = expected.into_iter().map(|(file, _)| file).collect();
    generated.sort();
    assert_eq!(names, generated, "stray files in manifests/crds; {hint}");
}

#[test]
fn names_scopes_and_subresources_follow_the_design() {
    let expected = [
        ("DaosSystem", "daossystems", "dsys", "Cluster"),
        ("DaosPool", "daospools", "dpool", "Cluster"),
        ("DaosContainer", "daoscontainers", "dcont", "Namespaced"),
        ("DaosTenant", "daostenants", "dtenant", "Cluster"),
    ];
    let crds = dpufs_api::crds();
    assert_eq!(crds.len(), expected.len());
    for (crd, (kind, plural, short, scope)) in crds.iter().zip(expected) {
        let names = &crd.spec.names;
        assert_eq!(crd.spec.group, "dpufs.io");
        assert_eq!(names.kind, kind);
        assert_eq!(names.plural, plural);
        assert_eq!(names.short_names.as_deref(), Some(&[short.to_string()][..]));
        assert_eq!(
            names.categories.as_deref(),
            Some(&["dpufs".to_string()][..])
        );
        assert_eq!(crd.spec.scope, scope, "{kind}");
        assert_eq!(crd.spec.versions.len(), 1);
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(version.served && version.storage);
        let status = version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref());
        assert!(status.is_some(), "{kind} has a status subresource");
    }
}

#[test]
fn printer_columns_name_schema_fields() {
    for crd in dpufs_api::crds() {
        let schema = schema(&crd);
        let columns = crd.spec.versions[0]
            .additional_printer_columns
            .as_deref()
            .unwrap();
        assert_eq!(columns.last().unwrap().name, "Age");
        for column in columns {
            if column.json_path.starts_with(".metadata.") {
                continue; // not in the CRD schema; the API server owns metadata
            }
            assert!(
                resolve(&schema, &column.json_path).is_some(),
                "{}: column {} names {}, which the schema lacks",
                crd.spec.names.kind,
                column.name,
                column.json_path
            );
        }
    }
}

/// The schema node a printer column's JSONPath reads; `[...]` selects items.
fn resolve<'a>(schema: &'a Value, json_path: &str) -> Option<&'a Value> {
    // `.a[?(@.type=="Ready")].b` → `.a[].b`
    let mut path = String::new();
    let mut depth = 0;
    for c in json_path.chars() {
        match c {
            '[' => {
                depth += 1;
                if depth == 1 {
                    path.push_str("[]");
                }
            }
            ']' => depth -= 1,
            _ if depth == 0 => path.push(c),
            _ => {}
        }
    }
    let mut node = schema;
    for part in path.trim_start_matches('.').split('.') {
        let (name, items) = part.strip_suffix("[]").map_or((part, false), |n| (n, true));
        node = node.get("properties")?.get(name)?;
        if items {
            node = node.get("items")?;
        }
    }
    Some(node)
}

/// The API server accepts only structural schemas: a type on every node
/// (int-or-string aside), no references or combinators, lists with item
/// schemas, and list-map keys that the items require.
#[test]
fn schemas_are_structural() {
    for crd in dpufs_api::crds() {
        let kind = crd.spec.names.kind.clone();
        walk(&kind, &schema(&crd), &mut |path, node| {
            for forbidden in ["$ref", "definitions", "oneOf", "anyOf", "allOf", "not"] {
                assert!(node.get(forbidden).is_none(), "{path} has {forbidden}");
            }
            assert!(
                node.get("x-kubernetes-preserve-unknown-fields").is_none(),
                "{path} keeps unknown fields"
            );
            let int_or_string = node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
            let ty = node.get("type").and_then(Value::as_str);
            assert!(
                ty.is_some() != int_or_string,
                "{path} needs exactly one of type and int-or-string"
            );
            if ty == Some("array") {
                let items = node
                    .get("items")
                    .unwrap_or_else(|| panic!("{path} has no items"));
                if node.get("x-kubernetes-list-type") == Some(&Value::from("map")) {
                    let keys = node["x-kubernetes-list-map-keys"].as_array().unwrap();
                    let required = items["required"].as_array().unwrap();
                    assert!(
                        keys.iter().all(|k| required.contains(k)),
                        "{path}: map keys must be required"
                    );
                }
            }
            if ty == Some("object") {
                assert!(
                    !(node.get("properties").is_some()
                        && node.get("additionalProperties").is_some()),
                    "{path} has both properties and additionalProperties"
                );
            }
        });
    }
}

/// Every rule compiles, uses only `self`/`oldSelf`, and kube-cel's estimate
/// stays inside the API server's per-rule budget.
#[test]
fn cel_rules_compile_within_the_cost_budget() {
    let mut rules = 0;
    for crd in dpufs_api::crds() {
        walk(&crd.spec.names.kind, &schema(&crd), &mut |path, node| {
            let Some(validations) = node.get("x-kubernetes-validations") else {
                return;
            };
            let compiled = compile_schema(node);
            let errors = compiled.compilation_errors();
            assert!(errors.is_empty(), "{path}: {errors:?}");
            for validation in validations.as_array().unwrap() {
                let rule = validation["rule"].as_str().unwrap();
                let warnings = analyze_rule(rule, &compiled, ScopeContext::CrdValidation);
                assert!(warnings.is_empty(), "{path}: {rule}: {warnings:?}");
                let message = validation
                    .get("message")
                    .or(validation.get("messageExpression"));
                assert!(message.is_some(), "{path}: {rule} has no message");
                rules += 1;
            }
        });
    }
    assert!(rules > 40, "only {rules} rules found");
}

/// CEL cost is estimated from the largest value a field can hold, so every
/// string and list the users write is bounded (the LabelSelector of
/// DaosTenant is Kubernetes's own type, and no rule reads it).
#[test]
fn spec_strings_and_lists_are_bounded() {
    for crd in dpufs_api::crds() {
        let kind = crd.spec.names.kind.clone();
        walk(
            &kind,
            &schema(&crd)["properties"]["spec"],
            &mut |path, node| {
                if path.contains("namespaceSelector") {
                    return;
                }
                match node.get("type").and_then(Value::as_str) {
                    Some("string") => assert!(
                        node.get("maxLength").is_some() || node.get("enum").is_some(),
                        "{path} is an unbounded string"
                    ),
                    Some("array") => assert!(
                        node.get("maxItems").is_some(),
                        "{path} is an unbounded list"
                    ),
                    _ if node.get("x-kubernetes-int-or-string").is_some() => {
                        assert!(
                            node.get("maxLength").is_some(),
                            "{path} is an unbounded string"
                        )
                    }
                    _ => {}
                }
            },
        );
    }
}

/// The API server estimates `string(<int>)` as costly as the longest string a
/// request may hold, and refuses a CRD whose message expression does that
/// (kube-apiserver 1.36: "estimated messageExpression cost exceeds budget by
/// factor of more than 100x"); kube's CEL analysis does not estimate message
/// costs, so this checks the form the server refused.
#[test]
fn message_expressions_never_turn_numbers_into_strings() {
    let mut checked = 0;
    for crd in dpufs_api::crds() {
        walk(&crd.spec.names.kind, &schema(&crd), &mut |path, node| {
            let numeric = |n: &Value| {
                matches!(
                    n.get("type").and_then(Value::as_str),
                    Some("integer" | "number")
                )
            };
            if !(numeric(node) || node.get("items").is_some_and(numeric)) {
                return;
            }
            for validation in node["x-kubernetes-validations"]
                .as_array()
                .into_iter()
                .flatten()
            {
                checked += 1;
                if let Some(message) = validation["messageExpression"].as_str() {
                    assert!(
                        !message.contains("string("),
                        "{path}: messageExpression {message:?} converts a number to a string"
                    );
                }
            }
        });
    }
    assert!(checked >= 2, "only {checked} rules on numbers found");
}
