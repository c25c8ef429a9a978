//! Key layout (docs/fabric.md, "Keys"): a 32-bit key is a 24-bit index into the device's MR/MW
//! table and an 8-bit key byte. The index is chosen by the device, the key byte of a type-2
//! window by the consumer in each bind.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Number of index bits in a key.
pub const KEY_INDEX_BITS: u32 = 24;

/// Largest number of entries a device table can have (the index space).
pub const MAX_TABLE_ENTRIES: u32 = 1 << KEY_INDEX_BITS;

/// Table index of a key.
pub const fn key_index(key: u32) -> u32 {
    key >> 8
}

/// Key byte (the "tag") of a key.
pub const fn key_byte(key: u32) -> u8 {
    (key & 0xff) as u8
}

/// Key made of an index and a key byte.
pub const fn make_key(index: u32, byte: u8) -> u32 {
    (index << 8) | byte as u32
}

/// `ibv_inc_rkey`: the next key byte for the same index. Use it to pick the rkey of a rebind,
/// so a stale handle of the previous binding no longer matches (a key byte never repeats within
/// 256 binds of one index).
pub const fn inc_rkey(key: u32) -> u32 {
    make_key(key_index(key), key_byte(key).wrapping_add(1))
}

/// How the device picks the index and initial key byte of new MRs and MWs. Real NICs are
/// predictable (ReDMArk: 2.85 bits of conditional entropy on mlx5, 0 on Broadcom and SoftRoCE);
/// the sequential modes let tests replay guessing attacks against that.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum KeyGen {
    /// Sequential index and a device-wide key byte counter: consecutive keys differ by 0x101.
    #[default]
    Mlx5Like,
    /// Sequential index, constant key byte: consecutive keys differ by 0x100.
    BnxtLike,
    /// Random free index and random key byte.
    Random,
}

impl KeyGen {
    /// Code stored in the device header.
    pub(crate) fn code(self) -> u32 {
        match self {
            KeyGen::Mlx5Like => 1,
            KeyGen::BnxtLike => 2,
            KeyGen::Random => 3,
        }
    }

    /// Inverse of [`KeyGen::code`].
    pub(crate) fn from_code(code: u32) -> Option<KeyGen> {
        match code {
            1 => Some(KeyGen::Mlx5Like),
            2 => Some(KeyGen::BnxtLike),
            3 => Some(KeyGen::Random),
            _ => None,
        }
    }
}

impl fmt::Display for KeyGen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyGen::Mlx5Like => "mlx5-like",
            KeyGen::BnxtLike => "bnxt-like",
            KeyGen::Random => "random",
        })
    }
}

impl FromStr for KeyGen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "mlx5-like" => Ok(KeyGen::Mlx5Like),
            "bnxt-like" => Ok(KeyGen::BnxtLike),
            "random" => Ok(KeyGen::Random),
            other => Err(format!(
                "unknown key generator {other:?} (mlx5-like, bnxt-like, random)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_increment() {
        let key = make_key(0x12_3456, 0xff);
        assert_eq!(key, 0x1234_56ff);
        assert_eq!(key_index(key), 0x12_3456);
        assert_eq!(key_byte(key), 0xff);
        // The key byte wraps; the index never changes.
        assert_eq!(inc_rkey(key), 0x1234_5600);
        assert_eq!(inc_rkey(0x0000_0107), 0x0000_0108);
    }

    #[test]
    fn generator_names_round_trip() {
        for g in [KeyGen::Mlx5Like, KeyGen::BnxtLike, KeyGen::Random] {
            assert_eq!(g.to_string().parse::<KeyGen>().unwrap(), g);
            assert_eq!(KeyGen::from_code(g.code()), Some(g));
        }
    }
}
