//! The digest annotation and the compare-before-apply check: a child is applied only when the
//! live object lacks the digest of the body we would send or a field we set no longer holds
//! our value, so a no-op reconcile makes no write.

use serde_json::{json, Value};

/// Annotation holding the digest of the spec we last applied: a change of it (a field we
/// stopped setting included) forces an apply even when the live object still holds
/// everything we set.
pub const DESIRED_DIGEST: &str = "mcp-runtime.dev/desired-digest";

/// Stamps the digest of `body` into its annotations.
pub fn with_digest(mut body: Value) -> Value {
    let digest = digest(&body);
    // Added beside the annotations the body has (the runtime-token Secret's); the others have
    // none, so theirs are exactly the digest.
    body["metadata"]["annotations"][DESIRED_DIGEST] = json!(digest);
    body
}

/// SHA-256 (hex) of the canonical JSON of `body` (serde_json maps are sorted).
pub fn digest(body: &Value) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, body.to_string().as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether the live object already is what we would apply: it carries the digest of this
/// desired body (nothing we set was added, changed or dropped since our last apply) and
/// every field we set still holds our value (nobody else changed it). Then applying would
/// change nothing and is skipped, so a no-op reconcile makes no write.
pub fn up_to_date(desired: &Value, live: &Value) -> bool {
    let want = &desired["metadata"]["annotations"][DESIRED_DIGEST];
    live["metadata"]["annotations"][DESIRED_DIGEST] == *want && contains(desired, live)
}

/// `live` holds every field of `desired` with the same value. Maps may have more keys
/// (server defaults); lists must match element by element; an empty list or map matches an
/// absent one (the API server drops them).
/// Resource quantities (the values of `limits` and `requests` maps) compare by value:
/// kube-apiserver stores them canonical (`0.5` as `500m`, `1024Mi` as `1Gi`).
pub fn contains(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(want), Value::Object(have)) => want.iter().all(|(k, w)| match have.get(k) {
            Some(h) if k == "limits" || k == "requests" => same_quantities(w, h),
            Some(h) => contains(w, h),
            None => is_empty(w),
        }),
        (Value::Object(want), Value::Null) => want.values().all(is_empty),
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| contains(w, h))
        }
        (Value::Array(want), Value::Null) => want.is_empty(),
        // Integer-valued fields may come back as 1 vs 1.0 in theory; compare as numbers.
        (Value::Number(w), Value::Number(h)) => w.as_f64() == h.as_f64(),
        (w, h) => w == h,
    }
}

/// A map of quantities holds the same values as another (extra keys allowed, as for any map).
fn same_quantities(want: &Value, have: &Value) -> bool {
    let (Value::Object(want), Value::Object(have)) = (want, have) else {
        return contains(want, have);
    };
    want.iter().all(|(k, w)| match (have.get(k), w) {
        (Some(Value::String(h)), Value::String(w)) => {
            h == w || matches!((quantity(w), quantity(h)), (Some(a), Some(b)) if a == b)
        }
        (Some(h), w) => contains(w, h),
        (None, w) => is_empty(w),
    })
}

/// The value of a Kubernetes quantity (`500m`, `1.5Gi`, `2e3`), approximately: close enough
/// to tell a canonicalized quantity from a changed one.
pub fn quantity(text: &str) -> Option<f64> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * scale)
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(is_empty),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_stable_and_independent_of_key_order() {
        let a =
            json!({"metadata": {"name": "x", "labels": {"a": "1", "b": "2"}}, "spec": {"n": 1}});
        let b =
            json!({"spec": {"n": 1}, "metadata": {"labels": {"b": "2", "a": "1"}, "name": "x"}});
        assert_eq!(digest(&a), digest(&b));
        // Pinned: a change here re-applies every live child once.
        assert_eq!(
            digest(&json!({"a": 1})),
            "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
        );
        assert_ne!(digest(&a), digest(&json!({"metadata": {"name": "y"}})));
        let stamped = with_digest(a.clone());
        assert_eq!(
            stamped["metadata"]["annotations"][DESIRED_DIGEST],
            digest(&a)
        );
        assert_eq!(stamped["spec"], a["spec"]);
    }

    #[test]
    fn up_to_date_needs_our_digest_and_every_field_we_set() {
        let desired = with_digest(json!({
            "metadata": {"name": "x", "labels": {"app": "x"}},
            "spec": {"replicas": 1, "ports": [{"port": 80}], "selector": {}},
        }));
        let mut live = desired.clone();
        // Server defaults and status on top, an empty map we set dropped: still up to date.
        live["metadata"]["uid"] = json!("u");
        live["spec"]["ports"][0]["protocol"] = json!("TCP");
        live["spec"].as_object_mut().unwrap().remove("selector");
        live["status"] = json!({"ready": true});
        assert!(up_to_date(&desired, &live));
        // A field we set changed by someone else.
        let mut drifted = live.clone();
        drifted["spec"]["replicas"] = json!(2.0);
        assert!(!up_to_date(&desired, &drifted));
        drifted["spec"]["replicas"] = json!(1.0);
        assert!(up_to_date(&desired, &drifted), "numbers compare by value");
        // Every field still there, but another digest: our last apply was another body.
        let mut stale = live.clone();
        stale["metadata"]["annotations"][DESIRED_DIGEST] = json!("0");
        assert!(!up_to_date(&desired, &stale));
        // A list element more is a change.
        let mut longer = live.clone();
        longer["spec"]["ports"]
            .as_array_mut()
            .unwrap()
            .push(json!({"port": 81}));
        assert!(!up_to_date(&desired, &longer));
        assert!(!up_to_date(&desired, &Value::Null));
    }

    #[test]
    fn quantities_compare_by_value_where_kubernetes_canonicalizes_them() {
        let want = json!({"resources": {"requests": {"cpu": "0.5", "memory": "1024Mi"},
                                        "limits": {"memory": "2e9"}},
                          "env": [{"name": "N", "value": "1000"}]});
        let live = json!({"resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                        "limits": {"memory": "2G"}},
                          "env": [{"name": "N", "value": "1000"}]});
        assert!(contains(&want, &live));
        let more = json!({"resources": {"requests": {"cpu": "600m", "memory": "1Gi"},
                                        "limits": {"memory": "2G"}},
                          "env": [{"name": "N", "value": "1000"}]});
        assert!(!contains(&want, &more), "a changed quantity is a change");
        // Elsewhere a string is a string: `1k` is not `1000` in an environment variable.
        let env = json!({"env": [{"name": "N", "value": "1k"}]});
        assert!(!contains(
            &json!({"env": [{"name": "N", "value": "1000"}]}),
            &env
        ));
        assert_eq!(quantity("1.5Gi"), Some(1.5 * 1024f64.powi(3)));
        assert_eq!(quantity("1e-3"), Some(1e-3));
        assert_eq!(quantity("12x"), None);
        assert_eq!(quantity(""), None);
    }
}
