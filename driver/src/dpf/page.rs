//! ListDevices' pages. Devices are listed in volume-id order; a token is the volume id of the
//! last entry of the page before, hex-encoded so that callers treat it as opaque. A page
//! starts after that id rather than at a position, so a device deleted between two pages
//! neither repeats an entry nor skips one.

use crate::dpf::backend::Device;
use crate::dpf::error::PluginError;

/// The page of `devices` that `max_entries` (0: all) and `token` select, and the token of
/// the next page (empty after the last).
pub fn page(
    mut devices: Vec<Device>,
    max_entries: i32,
    token: &str,
) -> Result<(Vec<Device>, String), PluginError> {
    let max = match usize::try_from(max_entries) {
        Ok(0) => usize::MAX,
        Ok(n) => n,
        Err(_) => return Err(PluginError::NegativeMaxEntries(max_entries)),
    };
    devices.sort_by(|a, b| a.spec.volume_id.cmp(&b.spec.volume_id));
    if let Some(after) = decode(token)? {
        devices.retain(|d| d.spec.volume_id > after);
    }
    if devices.len() <= max {
        return Ok((devices, String::new()));
    }
    devices.truncate(max);
    let next = encode(&devices[max - 1].spec.volume_id);
    Ok((devices, next))
}

fn encode(volume_id: &str) -> String {
    volume_id.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The volume id a token names; `None` for the empty token (the first page).
fn decode(token: &str) -> Result<Option<String>, PluginError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || PluginError::BadToken(excerpt(token));
    if !token.len().is_multiple_of(2) || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16).map_err(|_| bad()))
        .collect::<Result<Vec<u8>, _>>()?;
    String::from_utf8(bytes).map(Some).map_err(|_| bad())
}

/// The start of a token the plugin did not give, to quote in the error (it may be long).
fn excerpt(token: &str) -> String {
    const SHOWN: usize = 40;
    match token.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &token[..cut]),
        None => token.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dpf::backend::DeviceSpec;

    fn device(volume_id: &str) -> Device {
        Device {
            name: format!("dev-{volume_id}"),
            spec: DeviceSpec {
                volume_id: volume_id.into(),
                access_modes: vec![],
                publish_context: Default::default(),
                volume_context: Default::default(),
                storage_parameters: Default::default(),
            },
        }
    }

    fn ids(devices: &[Device]) -> Vec<&str> {
        devices.iter().map(|d| d.spec.volume_id.as_str()).collect()
    }

    #[test]
    fn pages_follow_volume_ids_and_the_last_has_no_token() {
        let all: Vec<Device> = ["v/c", "v/a", "v/e", "v/b", "v/d"]
            .into_iter()
            .map(device)
            .collect();
        let (first, t1) = page(all.clone(), 2, "").unwrap();
        assert_eq!(ids(&first), ["v/a", "v/b"]);
        let (second, t2) = page(all.clone(), 2, &t1).unwrap();
        assert_eq!(ids(&second), ["v/c", "v/d"]);
        let (third, t3) = page(all.clone(), 2, &t2).unwrap();
        assert_eq!(ids(&third), ["v/e"]);
        assert_eq!(t3, "");
        let (everything, none) = page(all.clone(), 0, "").unwrap();
        assert_eq!(everything.len(), 5);
        assert_eq!(none, "");
        // Exactly a page's worth left: no token for an empty page after it.
        let (rest, t) = page(all, 3, &t1).unwrap();
        assert_eq!(ids(&rest), ["v/c", "v/d", "v/e"]);
        assert_eq!(t, "");
    }

    #[test]
    fn a_device_deleted_between_pages_moves_nothing() {
        let all: Vec<Device> = ["a", "b", "c", "d"].into_iter().map(device).collect();
        let (_, token) = page(all.clone(), 2, "").unwrap();
        let without_b: Vec<Device> = all
            .into_iter()
            .filter(|d| d.spec.volume_id != "b")
            .collect();
        let (second, _) = page(without_b, 2, &token).unwrap();
        assert_eq!(ids(&second), ["c", "d"]);
    }

    #[test]
    fn tokens_not_given_and_negative_maxima_are_refused() {
        for bad in ["zz", "abc", "ff", "v1/a", "é0"] {
            assert!(
                matches!(page(vec![], 1, bad), Err(PluginError::BadToken(t)) if t == bad),
                "{bad}"
            );
        }
        assert!(matches!(
            page(vec![], -1, ""),
            Err(PluginError::NegativeMaxEntries(-1))
        ));
        let long = "x".repeat(10_000);
        assert!(matches!(
            page(vec![], 1, &long),
            Err(PluginError::BadToken(t)) if t == format!("{}…", "x".repeat(40))
        ));
        let id = "v1/sys/pool/ünïcode";
        assert_eq!(decode(&encode(id)).unwrap().as_deref(), Some(id));
    }
}
