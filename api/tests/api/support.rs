//! Validates objects against the generated CRDs the way the API server does:
//! the openAPIV3Schema (types, bounds, enums, unknown fields, list sets) with
//! a JSON Schema validator, and every `x-kubernetes-validations` rule,
//! transition rules included, with kube's CEL evaluator (kube-cel).

use kube::core::cel::{ErrorKind, Validator as CelValidator};
use serde_json::{Map, Value, json};

/// One kind's schema in both forms.
struct Kind {
    kind: String,
    /// The openAPIV3Schema as the CRD has it (CEL rules are read from here).
    openapi: Value,
    /// The same schema as JSON Schema draft 4.
    json: jsonschema::Validator,
}

/// The dpufs API: validates objects of every dpufs kind.
pub struct Api {
    kinds: Vec<Kind>,
    cel: CelValidator,
}

impl Api {
    pub fn new() -> Api {
        let kinds = dpufs_api::crds()
            .into_iter()
            .map(|crd| {
                let version = &crd.spec.versions[0];
                let openapi = serde_json::to_value(
                    version
                        .schema
                        .as_ref()
                        .and_then(|s| s.open_api_v3_schema.as_ref())
                        .expect("every dpufs CRD has a schema"),
                )
                .unwrap();
                let mut schema = to_json_schema(&openapi);
                schema["properties"]["apiVersion"] =
                    json!({ "enum": [format!("{}/{}", crd.spec.group, version.name)] });
                schema["properties"]["kind"] = json!({ "enum": [crd.spec.names.kind] });
                schema["properties"]["metadata"] = metadata_schema();
                schema["required"] = json!(["apiVersion", "kind", "metadata", "spec"]);
                let json = jsonschema::options()
                    .with_draft(jsonschema::Draft::Draft4)
                    .build(&schema)
                    .expect("the converted schema is valid JSON Schema");
                Kind {
                    kind: crd.spec.names.kind.clone(),
                    openapi,
                    json,
                }
            })
            .collect();
        Api {
            kinds,
            cel: CelValidator::new(),
        }
    }

    /// Everything the API server would object to when `object` is created
    /// (`old` is None) or replaces `old`, one line per problem: `path: message`.
    pub fn check(&self, object: &Value, old: Option<&Value>) -> Vec<String> {
        let kind = object["kind"].as_str().unwrap_or_default();
        let Some(kind) = self.kinds.iter().find(|k| k.kind == kind) else {
            return vec![format!("kind {kind:?} is not a dpufs kind")];
        };
        let mut problems: Vec<String> = kind
            .json
            .iter_errors(object)
            .map(|e| format!("{}: {e}", dotted(&e.instance_path().to_string())))
            .collect();
        let schema_ok = problems.is_empty();
        if let Err(errors) = self.cel.validate(&kind.openapi, object, old) {
            for error in errors {
                // A rule that cannot run is a bug in the CRD, unless the object's
                // shape is already wrong (the API server would not get that far).
                assert!(
                    error.kind == ErrorKind::ValidationFailure || !schema_ok,
                    "CEL rule {:?} did not evaluate: {error} ({:?})",
                    error.rule,
                    error.kind
                );
                problems.push(error.to_string());
            }
        }
        problems
    }
}

/// `/spec/size/0` → `spec.size[0]`.
fn dotted(pointer: &str) -> String {
    let mut out = String::new();
    for part in pointer.split('/').filter(|p| !p.is_empty()) {
        if part.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{part}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(part);
        }
    }
    out
}

/// What the API server checks in `metadata` of a custom resource: a name
/// that is a DNS subdomain. (It drops `namespace` from cluster-scoped objects.)
fn metadata_schema() -> Value {
    json!({
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {
                "type": "string",
                "maxLength": 253,
                "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
            },
        },
    })
}

/// Converts an OpenAPI v3 structural schema into JSON Schema draft 4 with the
/// API server's semantics: `nullable` admits null, int-or-string admits
/// integers and strings, `x-kubernetes-list-type: set` forbids duplicates, and
/// unknown fields are errors (kubectl's default strict field validation).
pub fn to_json_schema(openapi: &Value) -> Value {
    let node = openapi.as_object().expect("schemas are objects");
    let mut out = Map::new();
    for (key, value) in node {
        match key.as_str() {
            "properties" => {
                let props = value
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(name, schema)| (name.clone(), to_json_schema(schema)))
                    .collect();
                out.insert(key.clone(), Value::Object(props));
            }
            "items" => {
                out.insert(key.clone(), to_json_schema(value));
            }
            "additionalProperties" if value.is_object() => {
                out.insert(key.clone(), to_json_schema(value));
            }
            // Annotations and Kubernetes extensions handled below.
            "description" | "title" | "default" | "format" | "nullable" => {}
            k if k.starts_with("x-kubernetes-") => {}
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    let nullable = node.get("nullable") == Some(&json!(true));
    if node.get("x-kubernetes-int-or-string") == Some(&json!(true)) {
        let mut any_of = vec![json!({ "type": "integer" }), json!({ "type": "string" })];
        if nullable {
            any_of.push(json!({ "type": "null" }));
        }
        out.insert("anyOf".into(), Value::Array(any_of));
    } else if nullable && let Some(Value::String(t)) = node.get("type") {
        out.insert("type".into(), json!([t, "null"]));
    }
    if node.contains_key("properties") && !node.contains_key("additionalProperties") {
        out.insert("additionalProperties".into(), json!(false));
    }
    if node.get("x-kubernetes-list-type") == Some(&json!("set")) {
        out.insert("uniqueItems".into(), json!(true));
    }
    Value::Object(out)
}
