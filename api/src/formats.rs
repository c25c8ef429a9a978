//! Integer formats the API server knows. schemars names Rust's integer types
//! (`uint8`, `uint32`, `uint64`, ...), but Kubernetes knows only `int32` and
//! `int64` and warns on every apply of a CRD that uses others. Each such
//! integer gets the Kubernetes format that holds it, and the bounds of its
//! Rust type where the schema sets none, so the API server (not the
//! operator's deserializer) refuses a value that does not fit.

use serde_json::{Map, Value, json};

/// The Kubernetes format and the bounds of a schemars integer format, or
/// `None` for formats Kubernetes knows.
fn kubernetes_format(format: &str) -> Option<(&'static str, i64, Option<i64>)> {
    Some(match format {
        "int8" => ("int32", i64::from(i8::MIN), Some(i64::from(i8::MAX))),
        "int16" => ("int32", i64::from(i16::MIN), Some(i64::from(i16::MAX))),
        "uint8" => ("int32", 0, Some(i64::from(u8::MAX))),
        "uint16" => ("int32", 0, Some(i64::from(u16::MAX))),
        "uint32" => ("int64", 0, Some(i64::from(u32::MAX))),
        // Beyond int64 a JSON number is not exact anyway.
        "uint64" | "uint" => ("int64", 0, None),
        _ => return None,
    })
}

/// Rewrites every integer format in a schema (any JSON value) in place.
pub(crate) fn rewrite(value: &mut Value) {
    match value {
        Value::Object(object) => {
            rewrite_integer(object);
            object.values_mut().for_each(rewrite);
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite),
        _ => {}
    }
}

fn rewrite_integer(object: &mut Map<String, Value>) {
    if object.get("type").and_then(Value::as_str) != Some("integer") {
        return;
    }
    let Some((format, min, max)) = object
        .get("format")
        .and_then(Value::as_str)
        .and_then(kubernetes_format)
    else {
        return;
    };
    object.insert("format".into(), json!(format));
    object.entry("minimum").or_insert(json!(min));
    if let Some(max) = max {
        object.entry("maximum").or_insert(json!(max));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_formats_become_kubernetes_formats_with_their_bounds() {
        let mut schema = json!({"properties": {
            "small": {"type": "integer", "format": "uint8"},
            "ranged": {"type": "integer", "format": "uint8", "minimum": 1, "maximum": 9},
            "mid": {"type": "integer", "format": "uint32"},
            "big": {"type": "integer", "format": "uint64"},
            "known": {"type": "integer", "format": "int64"},
            "list": {"type": "array", "items": {"type": "integer", "format": "uint16"}},
            "text": {"type": "string", "format": "uint8"},
        }});
        rewrite(&mut schema);
        let p = &schema["properties"];
        assert_eq!(
            p["small"],
            json!({"type": "integer", "format": "int32", "minimum": 0, "maximum": 255})
        );
        assert_eq!(
            p["ranged"],
            json!({"type": "integer", "format": "int32", "minimum": 1, "maximum": 9})
        );
        assert_eq!(
            p["mid"],
            json!({"type": "integer", "format": "int64", "minimum": 0, "maximum": 4294967295u32})
        );
        assert_eq!(
            p["big"],
            json!({"type": "integer", "format": "int64", "minimum": 0})
        );
        assert_eq!(p["known"], json!({"type": "integer", "format": "int64"}));
        assert_eq!(p["list"]["items"]["format"], "int32");
        assert_eq!(p["text"]["format"], "uint8", "only integers are rewritten");
    }
}
