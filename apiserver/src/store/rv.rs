//! resourceVersions (their form is shared with the gateway: `apis::feed`) and continue tokens.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

pub use apis::feed::{GarbledVersion, ResourceVersion, EPOCH_LIMIT};

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
