//! A small bounded cache whose entries expire, for authentication and authorization results.
//!
//! Every entry lives for the same `ttl`, so insertion order is expiry order: at capacity the
//! expired entries are dropped from the old end, then the oldest live ones, one per insert.
//! A flood of new keys therefore pushes out old entries gradually instead of emptying the
//! cache, and memory stays bounded by `capacity`. Callers keep results of different kinds
//! (successes, failures) in separate caches so one kind cannot evict the other.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    cache: &'static str,
    result: &'static str,
}

/// Lookups of the authentication and authorization caches, by cache and hit or miss: the
/// hit ratio of each is `hit / (hit + miss)`.
#[derive(Clone, Debug, Default)]
pub struct AuthCacheMetrics {
    lookups: Family<CacheLabels, Counter>,
}

impl AuthCacheMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        // Every series from the start, at zero (standalone mode has no cache at all).
        for cache in [
            "token_authenticated",
            "token_rejected",
            "sar_allowed",
            "sar_denied",
        ] {
            for result in ["hit", "miss"] {
                metrics.counter(cache, result);
            }
        }
        registry
            .sub_registry_with_prefix("mcp_access_apiserver")
            .register(
                "auth_cache_lookups",
                "Lookups of the TokenReview and SubjectAccessReview caches by cache and result (hit, miss)",
                metrics.lookups.clone(),
            );
        metrics
    }

    fn counter(&self, cache: &'static str, result: &'static str) -> Counter {
        self.lookups
            .get_or_create(&CacheLabels { cache, result })
            .clone()
    }
}

struct Entry<V> {
    /// Position in `Inner::order`.
    seq: u64,
    at: Instant,
    value: V,
}

struct Inner<K, V> {
    entries: HashMap<K, Entry<V>>,
    /// Insertion sequence → key, oldest first.
    order: BTreeMap<u64, K>,
    next_seq: u64,
}

/// Entries live for `ttl`; at most `capacity` are kept (the oldest go first).
pub struct TtlCache<K, V> {
    ttl: Duration,
    capacity: usize,
    inner: Mutex<Inner<K, V>>,
    /// Live entries found and not found (counted only once registered with `counted`).
    hits: Counter,
    misses: Counter,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            ttl,
            capacity: capacity.max(1),
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                order: BTreeMap::new(),
                next_seq: 0,
            }),
            hits: Counter::default(),
            misses: Counter::default(),
        }
    }

    /// Counts this cache's lookups in `metrics` as `cache`.
    pub fn counted(mut self, metrics: &AuthCacheMetrics, cache: &'static str) -> Self {
        self.hits = metrics.counter(cache, "hit");
        self.misses = metrics.counter(cache, "miss");
        self
    }

    pub fn get(&self, key: &K) -> Option<V> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let found = inner
            .entries
            .get(key)
            .filter(|e| e.at.elapsed() < self.ttl)
            .map(|e| e.value.clone());
        match found {
            Some(_) => self.hits.inc(),
            None => self.misses.inc(),
        };
        found
    }

    /// Forgets an entry.
    pub fn remove(&self, key: &K) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = inner.entries.remove(key) {
            inner.order.remove(&old.seq);
        }
    }

    pub fn insert(&self, key: K, value: V) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *inner;
        if let Some(old) = inner.entries.remove(&key) {
            inner.order.remove(&old.seq);
        }
        // Expired entries sit at the old end; drop them all while we are here.
        while let Some((&seq, oldest)) = inner.order.first_key_value() {
            let expired = inner
                .entries
                .get(oldest)
                .is_none_or(|e| e.at.elapsed() >= self.ttl);
            if !expired {
                break;
            }
            if let Some(k) = inner.order.remove(&seq) {
                inner.entries.remove(&k);
            }
        }
        // Still full: make room by dropping the oldest live entries, never all of them.
        while inner.entries.len() >= self.capacity {
            match inner.order.pop_first() {
                Some((_, k)) => {
                    inner.entries.remove(&k);
                }
                None => break,
            }
        }
        let seq = inner.next_seq;
        inner.next_seq += 1;
        inner.order.insert(seq, key.clone());
        inner.entries.insert(
            key,
            Entry {
                seq,
                at: Instant::now(),
                value,
            },
        );
    }

    /// Number of entries held, expired ones included until they are pushed out.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        debug_assert_eq!(inner.entries.len(), inner.order.len());
        inner.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_are_counted_by_cache_and_result() {
        let mut registry = Registry::default();
        let metrics = AuthCacheMetrics::register(&mut registry);
        let cache = TtlCache::new(Duration::from_secs(60), 2).counted(&metrics, "sar_allowed");
        cache.insert("a", 1);
        cache.get(&"a");
        cache.get(&"a");
        cache.get(&"b");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                "mcp_access_apiserver_auth_cache_lookups_total{cache=\"sar_allowed\",result=\"hit\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "mcp_access_apiserver_auth_cache_lookups_total{cache=\"sar_allowed\",result=\"miss\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn entries_expire() {
        // A TTL long enough that a descheduled test thread still reads the entry live.
        let cache = TtlCache::new(Duration::from_millis(1000), 2);
        cache.insert("a", 1);
        assert_eq!(cache.get(&"a"), Some(1));
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(cache.get(&"a"), None);
    }

    #[test]
    fn at_capacity_only_the_oldest_entry_goes() {
        let cache = TtlCache::new(Duration::from_secs(60), 3);
        cache.insert("a", 1);
        cache.insert("b", 2);
        cache.insert("c", 3);
        cache.insert("d", 4);
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(&"a"), None, "the oldest entry is evicted");
        assert_eq!(cache.get(&"b"), Some(2));
        assert_eq!(cache.get(&"c"), Some(3));
        assert_eq!(cache.get(&"d"), Some(4));
    }

    #[test]
    fn a_flood_of_new_keys_never_empties_the_cache_at_once() {
        let capacity = 100;
        let cache = TtlCache::new(Duration::from_secs(60), capacity);
        for i in 0..capacity {
            cache.insert(format!("good-{i}"), i);
        }
        // Each new key costs exactly one old entry: after k flooding inserts the
        // newest capacity-k good entries are still there.
        for k in 1..capacity {
            cache.insert(format!("flood-{k}"), 0);
            assert_eq!(cache.len(), capacity);
            assert_eq!(
                cache.get(&format!("good-{}", capacity - 1)),
                Some(capacity - 1)
            );
            assert_eq!(cache.get(&format!("good-{k}")), Some(k));
            assert_eq!(cache.get(&format!("good-{}", k - 1)), None);
        }
        // Memory stays bounded however long the flood lasts.
        for k in 0..10 * capacity {
            cache.insert(format!("more-{k}"), 0);
        }
        assert_eq!(cache.len(), capacity);
    }

    #[test]
    fn expired_entries_go_before_live_ones() {
        let cache = TtlCache::new(Duration::from_millis(1000), 3);
        cache.insert("old1", 1);
        cache.insert("old2", 2);
        std::thread::sleep(Duration::from_millis(1100));
        cache.insert("live", 3);
        cache.insert("new", 4);
        // old1 and old2 expired and were dropped as soon as an insert saw them.
        assert_eq!(cache.len(), 2);
        cache.insert("newer", 5);
        assert_eq!(cache.get(&"live"), Some(3));
        assert_eq!(cache.get(&"new"), Some(4));
        assert_eq!(cache.get(&"newer"), Some(5));
    }

    #[test]
    fn reinserting_a_key_refreshes_it_without_growing() {
        let cache = TtlCache::new(Duration::from_secs(60), 2);
        cache.insert("a", 1);
        cache.insert("b", 2);
        cache.insert("a", 3);
        assert_eq!(cache.len(), 2);
        // "a" is now the newest, so "b" goes first.
        cache.insert("c", 4);
        assert_eq!(cache.get(&"a"), Some(3));
        assert_eq!(cache.get(&"b"), None);
        assert_eq!(cache.get(&"c"), Some(4));
    }
}
