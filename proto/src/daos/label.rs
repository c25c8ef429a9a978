//! DAOS label rules, shared by pools and containers: 1 to 127 characters of
//! `[A-Za-z0-9._:-]` that must not parse as a UUID.

use std::fmt;

/// Longest label DAOS accepts.
pub const MAX_LABEL_LEN: usize = 127;

/// What a container label reads back as when none was set; never settable.
pub const UNSET_CONTAINER_LABEL: &str = "container_label_not_set";

/// Why a label is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelError {
    Empty,
    TooLong(usize),
    BadChar(char),
    LooksLikeUuid,
    Reserved,
}

impl fmt::Display for LabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelError::Empty => write!(f, "label must not be empty"),
            LabelError::TooLong(n) => {
                write!(
                    f,
                    "label is {n} characters long, at most {MAX_LABEL_LEN} allowed"
                )
            }
            LabelError::BadChar(c) => write!(
                f,
                "label contains {c:?}; only letters, digits and . _ : - are allowed"
            ),
            LabelError::LooksLikeUuid => write!(f, "label must not be a UUID"),
            LabelError::Reserved => write!(f, "label {UNSET_CONTAINER_LABEL:?} is reserved"),
        }
    }
}

impl std::error::Error for LabelError {}

/// Checks a pool or container label against DAOS's rules.
pub fn validate_label(label: &str) -> Result<(), LabelError> {
    if label.is_empty() {
        return Err(LabelError::Empty);
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(LabelError::TooLong(label.len()));
    }
    if let Some(c) = label
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(LabelError::BadChar(c));
    }
    if parses_as_uuid(label) {
        return Err(LabelError::LooksLikeUuid);
    }
    if label == UNSET_CONTAINER_LABEL {
        return Err(LabelError::Reserved);
    }
    Ok(())
}

/// True for the forms a UUID parser accepts: 32 hex digits, optionally with
/// hyphens in the 8-4-4-4-12 places.
pub fn parses_as_uuid(s: &str) -> bool {
    let hex = |part: &str| part.chars().all(|c| c.is_ascii_hexdigit());
    match s.len() {
        32 => hex(s),
        36 => {
            let groups: Vec<&str> = s.split('-').collect();
            groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]) && groups.iter().all(|g| hex(g))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_daos_labels() {
        for ok in ["tank", "pool-1", "a.b_c:d", &"x".repeat(127)] {
            assert_eq!(validate_label(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn rejects_what_daos_rejects() {
        assert_eq!(validate_label(""), Err(LabelError::Empty));
        assert_eq!(
            validate_label(&"x".repeat(128)),
            Err(LabelError::TooLong(128))
        );
        assert_eq!(validate_label("a b"), Err(LabelError::BadChar(' ')));
        assert_eq!(validate_label("a/b"), Err(LabelError::BadChar('/')));
        assert_eq!(
            validate_label("6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f"),
            Err(LabelError::LooksLikeUuid)
        );
        assert_eq!(
            validate_label("6f1c2d1e3a4b4c5d8e9f0a1b2c3d4e5f"),
            Err(LabelError::LooksLikeUuid)
        );
        assert_eq!(
            validate_label(UNSET_CONTAINER_LABEL),
            Err(LabelError::Reserved)
        );
    }

    #[test]
    fn near_uuids_are_labels() {
        assert_eq!(
            validate_label("6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5g"),
            Ok(())
        );
        assert_eq!(
            validate_label("6f1c2d1e-3a4b4c5d-8e9f-0a1b-2c3d4e5f"),
            Ok(())
        );
    }
}
