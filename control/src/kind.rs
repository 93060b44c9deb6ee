//! Dataset kinds and what each requires of its bytes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a dataset holds. Tokens are little-endian, concatenated into one
/// stream, as Megatron's `.bin` files and 1-D `.npy` arrays are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum DatasetKind {
    #[serde(rename = "bytes")]
    Bytes,
    #[serde(rename = "tokens:u16")]
    TokensU16,
    #[serde(rename = "tokens:u32")]
    TokensU32,
    /// Samples of any size: concatenated bytes plus an index of
    /// `(offset, len)` per sample (or one fixed record size).
    #[serde(rename = "records")]
    Records,
    /// WebDataset tar shards; the index of samples is built at ingest.
    #[serde(rename = "wds")]
    Wds,
}

impl DatasetKind {
    /// Size of one element; a dataset's length is a multiple of it.
    pub fn element_size_bytes(self) -> u64 {
        match self {
            Self::Bytes | Self::Records | Self::Wds => 1,
            Self::TokensU16 => 2,
            Self::TokensU32 => 4,
        }
    }

    /// The `.npy` dtype descriptors this kind accepts (`None`: any).
    pub fn npy_dtypes(self) -> Option<&'static [&'static str]> {
        match self {
            Self::Bytes | Self::Records | Self::Wds => None,
            Self::TokensU16 => Some(&["<u2"]),
            Self::TokensU32 => Some(&["<u4"]),
        }
    }

    /// Whether samples are records with an index rather than token windows.
    pub fn has_records(self) -> bool {
        matches!(self, Self::Records | Self::Wds)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::TokensU16 => "tokens:u16",
            Self::TokensU32 => "tokens:u32",
            Self::Records => "records",
            Self::Wds => "wds",
        }
    }
}

impl fmt::Display for DatasetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DatasetKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bytes" => Ok(Self::Bytes),
            "tokens:u16" => Ok(Self::TokensU16),
            "tokens:u32" => Ok(Self::TokensU32),
            "records" => Ok(Self::Records),
            "wds" => Ok(Self::Wds),
            other => {
                Err(format!("unknown dataset kind {other:?} (expected bytes, tokens:u16, tokens:u32, records or wds)"))
            }
        }
    }
}
