//! resourceVersions and continue tokens.
//!
//! A resourceVersion is `epoch << 40 | seq` as a decimal string. The epoch is a random
//! non-zero 20-bit value rotated at every apiserver start, so the whole value stays below
//! 2^60 and parses as an int64 everywhere. Parsing is strict: anything else is garbled.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

const SEQ_BITS: u32 = 40;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// Largest epoch value (exclusive).
pub const EPOCH_LIMIT: u32 = 1 << 20;

/// Writes `metadata.resourceVersion` into a stored body (stored bodies carry none: the
/// version is the row's sequence number, known only once written).
pub(crate) fn set_resource_version(object: &mut serde_json::Value, rv: ResourceVersion) {
    if let Some(meta) = object.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.insert(
            "resourceVersion".into(),
            serde_json::Value::String(rv.to_string()),
        );
    }
}

/// A position in the change log of one epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceVersion {
    pub epoch: u32,
    pub seq: u64,
}

/// Why a resourceVersion string is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid resourceVersion {0:?}")]
pub struct GarbledVersion(pub String);

impl ResourceVersion {
    pub fn new(epoch: u32, seq: u64) -> Self {
        debug_assert!(epoch > 0 && epoch < EPOCH_LIMIT && seq <= SEQ_MASK);
        Self { epoch, seq }
    }

    /// Parses the decimal form. Leading zeros, signs, whitespace, a zero epoch or an
    /// out-of-range value are garbled.
    pub fn parse(s: &str) -> Result<Self, GarbledVersion> {
        let garbled = || GarbledVersion(s.to_string());
        if s.is_empty()
            || !s.bytes().all(|b| b.is_ascii_digit())
            || (s.len() > 1 && s.starts_with('0'))
        {
            return Err(garbled());
        }
        let v: u64 = s.parse().map_err(|_| garbled())?;
        let epoch = v >> SEQ_BITS;
        if epoch == 0 || epoch >= EPOCH_LIMIT as u64 {
            return Err(garbled());
        }
        Ok(Self {
            epoch: epoch as u32,
            seq: v & SEQ_MASK,
        })
    }

    pub fn as_u64(self) -> u64 {
        (u64::from(self.epoch) << SEQ_BITS) | self.seq
    }
}

impl fmt::Display for ResourceVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_u64())
    }
}

/// A continue token: the snapshot a paginated list is served at and the last key returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContinueToken {
    /// The list's resourceVersion.
    pub rv: String,
    /// Namespace of the last item returned ("" for cluster-scoped kinds).
    pub ns: String,
    /// Name of the last item returned.
    pub name: String,
}

/// A continue token that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid continue token")]
pub struct GarbledToken;

impl ContinueToken {
    pub fn encode(&self) -> String {
        // Serializing a struct of strings cannot fail.
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    pub fn decode(s: &str) -> Result<(Self, ResourceVersion), GarbledToken> {
        let bytes = URL_SAFE_NO_PAD
            .decode(s.trim_end_matches('='))
            .map_err(|_| GarbledToken)?;
        let token: Self = serde_json::from_slice(&bytes).map_err(|_| GarbledToken)?;
        let rv = ResourceVersion::parse(&token.rv).map_err(|_| GarbledToken)?;
        Ok((token, rv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let rv = ResourceVersion::new(0xABCDE, 123_456);
        assert_eq!(ResourceVersion::parse(&rv.to_string()), Ok(rv));
        assert!(rv.as_u64() < (1u64 << 63));
        for bad in [
            "",
            "-1",
            "0",
            "01",
            "abc",
            " 1",
            "1 ",
            "99999999999999999999",
            "123",
        ] {
            assert!(ResourceVersion::parse(bad).is_err(), "{bad}");
        }
        let max = ResourceVersion::new(EPOCH_LIMIT - 1, SEQ_MASK);
        assert_eq!(ResourceVersion::parse(&max.to_string()), Ok(max));
        assert!(ResourceVersion::parse(&((EPOCH_LIMIT as u64) << 40).to_string()).is_err());
    }

    #[test]
    fn continue_tokens() {
        let t = ContinueToken {
            rv: ResourceVersion::new(7, 9).to_string(),
            ns: "a".into(),
            name: "b".into(),
        };
        let (back, rv) = ContinueToken::decode(&t.encode()).unwrap();
        assert_eq!(back, t);
        assert_eq!(rv, ResourceVersion::new(7, 9));
        assert!(ContinueToken::decode("not-a-token").is_err());
        assert!(ContinueToken::decode(
            &URL_SAFE_NO_PAD.encode(b"{\"rv\":\"x\",\"ns\":\"\",\"name\":\"\"}")
        )
        .is_err());
    }
}
