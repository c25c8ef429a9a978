//! Byte sizes as users write them in manifests: `10Ti`, `500G` or a plain
//! number of bytes.

use crate::validation::{push, rule};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;

/// What the schema accepts: a whole number, or a number with an optional
/// fraction and a decimal (k M G T P E) or binary (Ki … Ei) suffix. A subset of
/// Kubernetes quantities without signs, exponents or milli-units.
const FORMAT: &str = "^([0-9]+|[0-9]+([.][0-9]+)?(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))$";

/// Longest quantity string accepted.
const MAX_LEN: u64 = 32;

/// A number of bytes, written as an integer (`1073741824`) or as a Kubernetes
/// quantity with a decimal or binary suffix (`1G`, `1Gi`, `1.5Ti`). Fractions
/// of a byte round up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ByteQuantity {
    /// A plain number of bytes.
    Bytes(u64),
    /// A quantity string such as `10Ti`.
    Quantity(String),
}

/// Why a quantity is not a byte size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantityError(String);

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a byte size: write a number of bytes or a quantity such as 512Mi, 10Gi or 100G",
            self.0
        )
    }
}

impl std::error::Error for QuantityError {}

impl ByteQuantity {
    /// The number of bytes, rounded up to a whole byte.
    pub fn bytes(&self) -> Result<u64, QuantityError> {
        let text = match self {
            ByteQuantity::Bytes(n) => return Ok(*n),
            ByteQuantity::Quantity(text) => text.as_str(),
        };
        let err = || QuantityError(text.to_string());
        let digits_end = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, suffix) = text.split_at(digits_end);
        let multiplier: u128 = match suffix {
            "" => 1,
            "k" => 1_000,
            "M" => 1_000_000,
            "G" => 1_000_000_000,
            "T" => 1_000_000_000_000,
            "P" => 1_000_000_000_000_000,
            "E" => 1_000_000_000_000_000_000,
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            "Ti" => 1 << 40,
            "Pi" => 1 << 50,
            "Ei" => 1 << 60,
            _ => return Err(err()),
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty()
            || !all_digits(whole)
            || !all_digits(fraction)
            || (number.contains('.') && (fraction.is_empty() || suffix.is_empty()))
            || whole.len() + fraction.len() > MAX_LEN as usize
        {
            return Err(err());
        }
        // value = whole.fraction × multiplier, computed exactly on integers.
        let scale = 10u128.pow(fraction.len() as u32);
        let mantissa: u128 = format!("{whole}{fraction}").parse().map_err(|_| err())?;
        let scaled = mantissa.checked_mul(multiplier).ok_or_else(err)?;
        u64::try_from(scaled.div_ceil(scale)).map_err(|_| err())
    }
}

impl JsonSchema for ByteQuantity {
    fn schema_name() -> Cow<'static, str> {
        "ByteQuantity".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let mut schema = json_schema!({
            "x-kubernetes-int-or-string": true,
            "maxLength": MAX_LEN,
        });
        push(
            &mut schema,
            rule(
                &format!("string(self).matches('{FORMAT}')"),
                "'\"' + string(self) + '\" is not a byte size: write a number of bytes or a quantity such as 512Mi, 10Gi, 4Ti or 100G'",
            ),
        );
        schema
    }
}

/// A CEL rule limiting a byte quantity to `min..=max` (quantity strings).
fn range(schema: &mut Schema, min: &str, max: Option<&str>) {
    let q = "quantity(string(self))";
    let (check, limits) = match max {
        Some(max) => (
            format!(
                "{q}.compareTo(quantity('{min}')) >= 0 && {q}.compareTo(quantity('{max}')) <= 0"
            ),
            format!("from {min} to {max}"),
        ),
        None => (
            format!("{q}.compareTo(quantity('{min}')) >= 0"),
            format!("at least {min}"),
        ),
    };
    push(
        schema,
        rule(
            // An unparsable value is reported by the format rule alone.
            &format!("!isQuantity(string(self)) || ({check})"),
            &format!("string(self) + ' is out of range: use {limits}'"),
        ),
    );
}

/// A size that must be at least one byte.
pub(crate) fn nonzero(schema: &mut Schema) {
    range(schema, "1", None);
}

/// A DAOS erasure-code cell size: 1 KiB to 1 GiB (pool property `ec_cell_sz`).
pub(crate) fn ec_cell_size(schema: &mut Schema) {
    range(schema, "1Ki", Some("1Gi"));
}

/// A DFS chunk size: dpufs accepts 4 KiB to 1 GiB (DFS's default is 1 MiB).
pub(crate) fn chunk_size(schema: &mut Schema) {
    range(schema, "4Ki", Some("1Gi"));
}

#[cfg(test)]
mod tests {
    use super::ByteQuantity;

    fn bytes(text: &str) -> Option<u64> {
        ByteQuantity::Quantity(text.to_string()).bytes().ok()
    }

    #[test]
    fn parses_suffixes_and_fractions() {
        assert_eq!(bytes("0"), Some(0));
        assert_eq!(bytes("1048576"), Some(1 << 20));
        assert_eq!(bytes("10Ti"), Some(10 << 40));
        assert_eq!(bytes("500G"), Some(500_000_000_000));
        assert_eq!(bytes("1.5Ki"), Some(1536));
        assert_eq!(bytes("1.0001k"), Some(1001), "fractions round up");
        assert_eq!(bytes("15Ei"), Some(15 << 60));
        assert_eq!(ByteQuantity::Bytes(7).bytes(), Ok(7));
    }

    #[test]
    fn rejects_what_the_schema_rejects() {
        for bad in [
            "", "1.5", "1K", "-1", "+1", "1e3", "1m", "1.Gi", ".5Gi", "1 Gi",
        ] {
            assert_eq!(bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn reports_overflow() {
        assert_eq!(bytes("16Ei"), None, "2^64 does not fit in u64");
    }
}
