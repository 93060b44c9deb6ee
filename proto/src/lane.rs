//! The data plane's two admission lanes, as the engine, the transports'
//! counters and `/metrics` name them.

/// The two admission lanes of the data plane: small reads go first.
/// Named by [`Lane::name`] in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum Lane {
    Latency = 0,
    Bulk = 1,
}

impl Lane {
    /// Both lanes, in the order a core serves them.
    pub const ALL: [Lane; 2] = [Lane::Latency, Lane::Bulk];

    /// Its index into per-lane arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Latency => "latency",
            Self::Bulk => "bulk",
        }
    }
}
