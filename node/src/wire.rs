//! The encoding both sockets use: one JSON object per line, keys sorted at every level, and
//! answers that carry `"ok": true` or `{"ok": false, "error": "…"}`.

use serde::Serialize;
use serde_json::{Map, Value};

/// The line `message` is sent as (without the newline): its keys sorted at every level, as
/// serde_json's `Value` writes them. Every message has always been sent this way, so the
/// order of fields in a Rust type never shows on the wire.
pub fn encode<T: Serialize + ?Sized>(message: &T) -> String {
    to_value(message).to_string()
}

/// `message` as a JSON value. The types of this crate always serialize (string keys only).
pub(crate) fn to_value<T: Serialize + ?Sized>(message: &T) -> Value {
    serde_json::to_value(message).expect("protocol messages serialize to JSON")
}

/// An accepted answer: the fields of `payload` (an object) with `"ok": true`.
pub(crate) fn ok<T: Serialize + ?Sized>(payload: &T) -> Value {
    let mut v = to_value(payload);
    match &mut v {
        Value::Object(m) => {
            m.insert("ok".into(), Value::Bool(true));
        }
        _ => {
            let mut m = Map::new();
            m.insert("ok".into(), Value::Bool(true));
            v = Value::Object(m);
        }
    }
    v
}

/// A refusal: `{"ok": false, "error": …}`.
pub(crate) fn refused(error: &str) -> Value {
    let mut m = Map::new();
    m.insert("ok".into(), Value::Bool(false));
    m.insert("error".into(), Value::String(error.to_string()));
    Value::Object(m)
}

/// Why an answer could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("the answer is not JSON: {0}")]
    NotJson(String),
    #[error("unexpected answer to {request}: {detail}")]
    Unexpected {
        request: &'static str,
        detail: String,
    },
}

/// The error of a refusal (`"ok": false`), if `v` is one.
pub(crate) fn refusal(v: &Value) -> Option<String> {
    (v.get("ok") == Some(&Value::Bool(false))).then(|| {
        v.get("error")
            .and_then(Value::as_str)
            .unwrap_or("refused")
            .to_string()
    })
}

/// `v` as a `T`, for the answer to `request`.
pub(crate) fn payload<T: serde::de::DeserializeOwned>(
    request: &'static str,
    v: Value,
) -> Result<T, DecodeError> {
    serde_json::from_value(v).map_err(|e| DecodeError::Unexpected {
        request,
        detail: e.to_string(),
    })
}

/// Parses one line of JSON.
pub(crate) fn parse(text: &str) -> Result<Value, DecodeError> {
    serde_json::from_str(text).map_err(|e| DecodeError::NotJson(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sorted_at_every_level() {
        #[derive(Serialize)]
        struct Inner {
            z: u8,
            a: u8,
        }
        #[derive(Serialize)]
        struct Outer {
            op: &'static str,
            inner: Inner,
            b: Option<u8>,
        }
        let text = encode(&Outer {
            op: "x",
            inner: Inner { z: 1, a: 2 },
            b: None,
        });
        assert_eq!(text, r#"{"b":null,"inner":{"a":2,"z":1},"op":"x"}"#);
    }

    #[test]
    fn refusals_are_recognised() {
        assert_eq!(
            encode(&refused("no")),
            r#"{"error":"no","ok":false}"#.to_string()
        );
        assert_eq!(refusal(&refused("no")), Some("no".into()));
        assert_eq!(refusal(&ok(&Map::new())), None);
    }
}
