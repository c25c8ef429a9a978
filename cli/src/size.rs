//! Sizes as people write them on the command line (`10G`, `512M`, `1.5T`,
//! `4096`) and the two-tier splits of `pool create`.
//!
//! Units are binary (`G` = `GiB` = 2^30), the way pool sizes are thought of.
//! Decimal spellings such as `GB` are refused instead of being read as binary:
//! dmg reads them as powers of ten, and a silent 7 % difference is worse than
//! an error.

/// Binary unit letters and their shifts.
const UNITS: [(char, u32); 6] = [
    ('K', 10),
    ('M', 20),
    ('G', 30),
    ('T', 40),
    ('P', 50),
    ('E', 60),
];

/// Longest fraction accepted (`1.000000000000000001G` is already silly).
const MAX_DECIMALS: usize = 18;

/// Parses a size: digits with an optional fraction, then an optional binary
/// unit (`K`, `M`, `G`, `T`, `P`, `E`, optionally followed by `iB`), or `B`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (number, unit) = t.split_at(
        t.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(t.len()),
    );
    let shift = unit_shift(unit.trim()).ok_or_else(|| {
        format!("size {text:?}: unknown unit {unit:?}; use K, M, G, T, P or E (binary: G = GiB)")
    })?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(format!(
            "size {text:?}: expected a number such as 10G, 512M or 4096"
        ));
    }
    if !fraction.is_empty() && shift == 0 {
        return Err(format!("size {text:?}: bytes cannot be fractional"));
    }
    if fraction.len() > MAX_DECIMALS {
        return Err(format!("size {text:?}: at most {MAX_DECIMALS} decimals"));
    }
    let digits = |s: &str| -> Result<u128, String> {
        match s {
            "" => Ok(0),
            s => s
                .parse::<u64>()
                .map(u128::from)
                .map_err(|_| format!("size {text:?}: {s:?} is not a number")),
        }
    };
    let unit = 1u128 << shift;
    // Neither product can overflow: both factors are below 2^64.
    let total =
        digits(whole)? * unit + digits(fraction)? * unit / 10u128.pow(fraction.len() as u32);
    u64::try_from(total).map_err(|_| format!("size {text:?} is too large"))
}

/// The shift of a unit suffix; None for unknown or decimal units.
fn unit_shift(unit: &str) -> Option<u32> {
    if unit.is_empty() || unit.eq_ignore_ascii_case("B") {
        return Some(0);
    }
    let mut chars = unit.chars();
    let letter = chars.next()?.to_ascii_uppercase();
    let rest = chars.as_str();
    let (_, shift) = UNITS.iter().find(|(l, _)| *l == letter)?;
    matches!(rest, "" | "i" | "iB").then_some(*shift)
}

/// Parses `META,DATA` sizes (per rank) of `--tier-bytes`.
pub fn parse_tier_bytes(text: &str) -> Result<[u64; 2], String> {
    let (meta, data) = pair(text, "--tier-bytes META,DATA")?;
    Ok([parse_size(meta)?, parse_size(data)?])
}

/// Parses `--tier-ratio` percentages, `6,94`, into fractions.
pub fn parse_tier_ratio(text: &str) -> Result<[f64; 2], String> {
    let (meta, data) = pair(text, "--tier-ratio META%,DATA%")?;
    let percent = |s: &str| match s.trim().parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p / 100.0),
        _ => Err(format!(
            "tier ratio {s:?} is not a percentage from 0 to 100"
        )),
    };
    Ok([percent(meta)?, percent(data)?])
}

fn pair<'a>(text: &'a str, usage: &str) -> Result<(&'a str, &'a str), String> {
    text.split_once(',')
        .filter(|(_, b)| !b.contains(','))
        .ok_or_else(|| format!("{text:?}: expected two values, {usage}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_bytes_and_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("10g"), Ok(10 << 30));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("10Gi"), Ok(10 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size(" 2 G "), Ok(2 << 30));
    }

    #[test]
    fn fractions_of_units() {
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size(".5K"), Ok(512));
        assert_eq!(parse_size("0.001K"), Ok(1));
        assert!(parse_size("1.5").is_err());
    }

    #[test]
    fn refuses_nonsense_and_decimal_units() {
        for bad in [
            "", "G", "abc", "10X", "10GB", "10MB", "1.2.3G", "-1G", "10 G B",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(parse_size("16E").is_err(), "overflows u64");
        assert_eq!(parse_size("15E"), Ok(15 << 60));
    }

    #[test]
    fn tier_pairs() {
        assert_eq!(parse_tier_bytes("64M,1G"), Ok([64 << 20, 1 << 30]));
        assert!(parse_tier_bytes("64M").is_err());
        assert!(parse_tier_bytes("1M,2M,3M").is_err());
        assert_eq!(parse_tier_ratio("6,94"), Ok([0.06, 0.94]));
        assert_eq!(parse_tier_ratio("100,0"), Ok([1.0, 0.0]));
        assert!(parse_tier_ratio("6,101").is_err());
        assert!(parse_tier_ratio("x,94").is_err());
    }
}
