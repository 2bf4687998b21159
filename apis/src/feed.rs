//! What the change feed tells its watchers beyond Kubernetes' own watch protocol: the
//! resourceVersion's form, and what bookmarks and 410s carry so that a cache can bound its
//! lag (docs/gateways.md, "Lag bound"). Shared by the apiserver, which writes them, and the
//! gateway, which reads them; any other client ignores them.

use std::fmt;

const SEQ_BITS: u32 = 40;
/// Largest sequence number of one epoch.
pub const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// Largest epoch value (exclusive).
pub const EPOCH_LIMIT: u32 = 1 << 20;

/// On every BOOKMARK: the change log's head as the apiserver knows it (the newest committed
/// change its heartbeat or its reader saw, of the bookmark's epoch). A watcher whose position
/// is below it is behind by that much.
pub const HEAD_ANNOTATION: &str = "access.mcp-runtime.dev/head";
/// On every BOOKMARK: the interval, in milliseconds, at which this watch sends bookmarks
/// while the feed can vouch for being current. A watcher that hears nothing for a few
/// intervals knows the stream (or the feed behind it) went quiet.
pub const BOOKMARK_INTERVAL_ANNOTATION: &str = "access.mcp-runtime.dev/bookmark-interval-ms";
/// `details.causes[].reason` of a 410 whose cause is a new epoch (a restored database or an
/// operator's rotation): the history the watcher followed is gone, not only its position.
pub const EPOCH_CHANGED_CAUSE: &str = "EpochChanged";

/// A position in the change log of one epoch.
///
/// Its wire form is `epoch << 40 | seq` as a decimal string. The epoch is a random non-zero
/// 20-bit value, changed only when the history in the database may no longer be the one
/// clients saw (docs/storage.md, "Epoch"), so the whole value stays below 2^60 and parses as
/// an int64 everywhere. Parsing is strict: anything else is garbled.
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

    /// How many changes `self` is behind `head`: `None` when they are of different epochs
    /// (no distance is defined across a history reset).
    pub fn behind(self, head: Self) -> Option<u64> {
        (self.epoch == head.epoch).then(|| head.seq.saturating_sub(self.seq))
    }
}

impl fmt::Display for ResourceVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_u64())
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
    fn distance_is_defined_within_one_epoch_only() {
        let at = ResourceVersion::new(7, 10);
        assert_eq!(at.behind(ResourceVersion::new(7, 15)), Some(5));
        assert_eq!(at.behind(ResourceVersion::new(7, 3)), Some(0));
        assert_eq!(at.behind(ResourceVersion::new(8, 15)), None);
    }
}
