//! Lists served from the stored JSON: each item is the row's text with
//! `metadata.resourceVersion` spliced in, never decoded into its type and encoded again.
//!
//! A stored body is the typed object as the server encoded it, without
//! `metadata.resourceVersion` (that is the row's sequence, rendered with the current epoch).
//! The splice is byte-level and shallow: it walks the top-level members of the object and
//! the members of `metadata`, skipping every other value without interpreting it. It takes
//! the fast path only for a body in the canonical shape (an object whose `apiVersion` and
//! `kind` are the served ones and whose `metadata` object carries no `resourceVersion`, no
//! key spelled with an escape); for anything else it says so and the caller renders the item
//! through its type, exactly as a typed list would.

use bytes::Bytes;
use futures::stream::BoxStream;

use super::error::{Result, StoreError};
use super::query::ObjectList;
use super::rv::ResourceVersion;
use apis::Kind;

/// Items of a list as served JSON, in list order. An error after the first item means the
/// list cannot be completed (the response must end abnormally, never look complete).
pub type RawItems = BoxStream<'static, Result<Bytes>>;

/// One page of a list as served JSON (see [`super::Store::list_raw`]).
pub struct RawList {
    /// The snapshot the page is read at (the same on every page of one list).
    pub resource_version: ResourceVersion,
    /// Set when more items follow.
    pub continue_token: Option<String>,
    /// The items, each `{"apiVersion":…,"kind":…,"metadata":{"resourceVersion":…,…},…}`.
    pub items: RawItems,
}

impl std::fmt::Debug for RawList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawList")
            .field("resource_version", &self.resource_version)
            .field("continue_token", &self.continue_token)
            .finish_non_exhaustive()
    }
}

/// A typed page encoded item by item: how stores without stored text (and kinds whose
/// objects are completed when read) serve [`super::Store::list_raw`].
pub fn from_typed<K: Kind>(list: ObjectList<K>) -> Result<RawList> {
    let items = list
        .items
        .into_iter()
        .map(|object| typed_json(object).map(Ok))
        .collect::<Result<Vec<_>>>()?;
    Ok(RawList {
        resource_version: list.resource_version,
        continue_token: list.continue_token,
        items: Box::pin(futures::stream::iter(items)),
    })
}

/// The served JSON of a typed object (`apiVersion` and `kind` set).
pub fn typed_json<K: Kind>(mut object: K) -> Result<Bytes> {
    object.set_type_meta();
    serde_json::to_vec(&object)
        .map(Bytes::from)
        .map_err(|e| StoreError::Internal(format!("cannot encode {}: {e}", K::KIND)))
}

/// The served JSON of stored body text: the splice when the body is canonical, else the
/// body decoded into `K` (resourceVersion set) and encoded, as the typed path renders it.
pub fn served_json<K: Kind>(stored: &str, rv: ResourceVersion) -> Result<Bytes> {
    if let Some(spliced) = splice_resource_version(stored, apis::API_VERSION, K::KIND, rv) {
        return Ok(Bytes::from(spliced));
    }
    let mut body: serde_json::Value = serde_json::from_str(stored)
        .map_err(|e| StoreError::Internal(format!("stored {} is unreadable: {e}", K::KIND)))?;
    super::rv::set_resource_version(&mut body, rv);
    let object: K = serde_json::from_value(body)
        .map_err(|e| StoreError::Internal(format!("stored {} is unreadable: {e}", K::KIND)))?;
    typed_json(object)
}

/// `stored` with `"resourceVersion":"<rv>"` as the first member of its `metadata`, when
/// `stored` is a canonical body of `kind` in `api_version` (see the module doc); `None`
/// otherwise.
pub fn splice_resource_version(
    stored: &str,
    api_version: &str,
    kind: &str,
    rv: ResourceVersion,
) -> Option<Vec<u8>> {
    let bytes = stored.as_bytes();
    let mut top = Scanner { b: bytes, i: 0 };
    let mut metadata = None;
    let (mut api_version_ok, mut kind_ok) = (false, false);
    top.members(|key, value| {
        match key {
            b"metadata" => metadata = Some(value),
            b"apiVersion" => api_version_ok = is_json_string(&bytes[value.0..value.1], api_version),
            b"kind" => kind_ok = is_json_string(&bytes[value.0..value.1], kind),
            _ => {}
        }
        true
    })?;
    top.ws();
    if top.i != bytes.len() || !api_version_ok || !kind_ok {
        return None;
    }
    let (start, end) = metadata?;
    let mut meta = Scanner {
        b: &bytes[..end],
        i: start,
    };
    let mut empty = true;
    let mut carries_rv = false;
    meta.members(|key, _| {
        empty = false;
        carries_rv |= key == b"resourceVersion";
        !carries_rv
    })?;
    if carries_rv || meta.i != end {
        return None;
    }
    // `start` is the metadata object's `{`.
    let rv = rv.to_string();
    let mut out = Vec::with_capacity(bytes.len() + rv.len() + 24);
    out.extend_from_slice(&bytes[..=start]);
    out.extend_from_slice(b"\"resourceVersion\":\"");
    out.extend_from_slice(rv.as_bytes());
    out.push(b'"');
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(&bytes[start + 1..]);
    Some(out)
}

/// Whether `token` is the JSON string `expected` spelled without escapes (an escaped
/// spelling is not canonical: the caller falls back to the typed rendering).
fn is_json_string(token: &[u8], expected: &str) -> bool {
    token.len() == expected.len() + 2
        && token[0] == b'"'
        && token[token.len() - 1] == b'"'
        && &token[1..token.len() - 1] == expected.as_bytes()
        && !expected
            .bytes()
            .any(|b| b == b'"' || b == b'\\' || b < 0x20)
}

/// A shallow JSON scanner over well-formed text (PostgreSQL's rendering of jsonb, or
/// serde_json's): it finds value boundaries without interpreting values. It never
/// recurses, so nesting depth costs nothing; malformed input makes it give up (`None`).
struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl Scanner<'_> {
    fn ws(&mut self) {
        while self.b.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
    }

    /// A string starting at the cursor; returns its span, quotes included.
    fn string(&mut self) -> Option<(usize, usize)> {
        let start = self.i;
        if self.b.get(self.i) != Some(&b'"') {
            return None;
        }
        self.i += 1;
        loop {
            match self.b.get(self.i)? {
                b'"' => {
                    self.i += 1;
                    return Some((start, self.i));
                }
                b'\\' => self.i += 2,
                _ => self.i += 1,
            }
        }
    }

    /// Any value starting at the cursor (after whitespace); returns its span.
    fn value(&mut self) -> Option<(usize, usize)> {
        self.ws();
        let start = self.i;
        match *self.b.get(self.i)? {
            b'"' => self.string(),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match *self.b.get(self.i)? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                return Some((start, self.i));
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
            }
            _ => {
                while self
                    .b
                    .get(self.i)
                    .is_some_and(|c| !matches!(c, b',' | b'}' | b']') && !c.is_ascii_whitespace())
                {
                    self.i += 1;
                }
                (self.i > start).then_some((start, self.i))
            }
        }
    }

    /// The members of the object at the cursor, each key (unquoted, raw) with its value's
    /// span, until `each` says stop. A key with an escape in it gives up: it could spell a
    /// name the caller looks for.
    fn members(&mut self, mut each: impl FnMut(&[u8], (usize, usize)) -> bool) -> Option<()> {
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            self.ws();
            let (ks, ke) = self.string()?;
            let key = &self.b[ks + 1..ke - 1];
            if key.contains(&b'\\') {
                return None;
            }
            self.eat(b':')?;
            let value = self.value()?;
            if !each(key, value) {
                return Some(());
            }
            if self.eat(b',').is_some() {
                continue;
            }
            self.eat(b'}')?;
            return Some(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::strategy::Strategy;
    use apis::{AccessSession, Agent, Enrollment, Revocation};
    use serde_json::{json, Value};

    const AV: &str = apis::API_VERSION;

    fn rv() -> ResourceVersion {
        ResourceVersion::new(0xABCDE, 4242)
    }

    fn splice(text: &str) -> Option<Value> {
        splice_resource_version(text, AV, "AccessSession", rv()).map(|out| {
            serde_json::from_slice(&out).unwrap_or_else(|e| {
                panic!(
                    "spliced text is not JSON ({e}): {}",
                    String::from_utf8_lossy(&out)
                )
            })
        })
    }

    fn with_rv(mut v: Value) -> Value {
        v["metadata"]["resourceVersion"] = json!(rv().to_string());
        v
    }

    /// The body of `v` as PostgreSQL renders jsonb text (keys by length, `": "` and `", "`).
    fn jsonb_text(v: &Value) -> String {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)));
                let members: Vec<String> = keys
                    .into_iter()
                    .map(|k| format!("{}: {}", json!(k), jsonb_text(&map[k])))
                    .collect();
                format!("{{{}}}", members.join(", "))
            }
            Value::Array(items) => format!(
                "[{}]",
                items.iter().map(jsonb_text).collect::<Vec<_>>().join(", ")
            ),
            other => other.to_string(),
        }
    }

    fn body() -> Value {
        json!({
            "apiVersion": AV,
            "kind": "AccessSession",
            "metadata": {"name": "s-1", "namespace": "ns", "uid": "u",
                         "labels": {"a": "b}", "c\"": "{["},
                         "annotations": {"metadata": "{\"resourceVersion\":\"1\"}"}},
            "spec": {"server": {"name": "github", "uid": "srv"}, "teams": ["x", "y"],
                     "metadata": {"resourceVersion": "nested, not ours"},
                     "n": [1, -2.5e3, true, null, {"deep": [[[]]]}]},
            "status": {"phase": "Active"},
        })
    }

    #[test]
    fn splices_compact_and_jsonb_text_alike() {
        let b = body();
        for text in [
            b.to_string(),
            jsonb_text(&b),
            serde_json::to_string_pretty(&b).unwrap(),
        ] {
            assert_eq!(splice(&text), Some(with_rv(b.clone())), "{text}");
        }
    }

    #[test]
    fn the_rv_is_the_first_member_of_metadata() {
        let text = r#"{"kind": "AccessSession", "metadata": {"name": "a"}, "apiVersion": "access.mcp-runtime.dev/v1alpha1"}"#;
        let out = splice_resource_version(text, AV, "AccessSession", rv()).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!(
                r#"{{"kind": "AccessSession", "metadata": {{"resourceVersion":"{}","name": "a"}}, "apiVersion": "access.mcp-runtime.dev/v1alpha1"}}"#,
                rv()
            )
        );
        let empty = r#"{"kind":"AccessSession","metadata":{ },"apiVersion":"access.mcp-runtime.dev/v1alpha1"}"#;
        assert_eq!(
            splice(empty),
            Some(json!({"kind": "AccessSession", "apiVersion": AV,
                        "metadata": {"resourceVersion": rv().to_string()}}))
        );
    }

    #[test]
    fn anything_not_canonical_is_left_to_the_typed_rendering() {
        let b = body();
        let mut carries_rv = b.clone();
        carries_rv["metadata"]["resourceVersion"] = json!("7");
        let mut no_type_meta = b.clone();
        no_type_meta["apiVersion"] = json!("");
        let mut other_kind = b.clone();
        other_kind["kind"] = json!("Agent");
        let mut other_version = b.clone();
        other_version["apiVersion"] = json!("access.mcp-runtime.dev/v1");
        let mut metadata_not_object = b.clone();
        metadata_not_object["metadata"] = json!(["x"]);
        let mut no_metadata = b.clone();
        no_metadata.as_object_mut().unwrap().remove("metadata");
        for v in [
            carries_rv,
            no_type_meta,
            other_kind,
            other_version,
            metadata_not_object,
            no_metadata,
        ] {
            assert_eq!(splice(&v.to_string()), None, "{v}");
            assert_eq!(splice(&jsonb_text(&v)), None, "{v}");
        }
        let text = b.to_string();
        for bad in [
            String::new(),
            "[]".into(),
            "\"x\"".into(),
            text[..text.len() - 1].to_string(),
            format!("{text}x"),
            format!("{text}{{}}"),
            text.replacen("\"metadata\"", "\"meta\\u0064ata\"", 1),
            text.replacen(
                "\"metadata\":{",
                "\"metadata\":{\"resource\\u0056ersion\":\"1\",",
                1,
            ),
            text.replacen(
                "\"kind\":\"AccessSession\"",
                "\"kind\":\"Access\\u0053ession\"",
                1,
            ),
        ] {
            assert_eq!(splice(&bad), None, "{bad}");
        }
    }

    #[test]
    fn served_json_falls_back_to_the_typed_rendering() {
        let mut typed = AccessSession::default();
        typed.metadata.name = Some("s-1".into());
        typed.metadata.namespace = Some("ns".into());
        typed.spec.server.name = "github".into();
        // Stored without type meta (as an old row might be): not spliced, rendered typed.
        let stored = serde_json::to_string(&typed).unwrap();
        assert_eq!(splice(&stored), None);
        let served: Value =
            serde_json::from_slice(&served_json::<AccessSession>(&stored, rv()).unwrap()).unwrap();
        let mut expected = typed.clone();
        expected.metadata.resource_version = Some(rv().to_string());
        let expected: Value = serde_json::from_slice(&typed_json(expected).unwrap()).unwrap();
        assert_eq!(served, expected);
        assert_eq!(served["kind"], "AccessSession");
        // And the canonical form takes the splice, to the same JSON.
        typed.set_type_meta();
        let canonical = serde_json::to_string(&typed).unwrap();
        let spliced: Value =
            serde_json::from_slice(&served_json::<AccessSession>(&canonical, rv()).unwrap())
                .unwrap();
        assert_eq!(spliced, expected);
        assert!(matches!(
            served_json::<AccessSession>("{\"metadata\":{}}", rv()),
            Err(StoreError::Internal(_))
        ));
    }

    /// A kind whose reads add fields must declare it: its lists are then rendered through
    /// its type, never from the stored text alone.
    #[test]
    fn kinds_declare_whether_reads_complete_them() {
        fn check<K: Strategy + Default>() {
            let mut object = K::default();
            object.meta_mut().uid = Some("uid-1".into());
            object.meta_mut().name = Some("x".into());
            let asks = !K::read_facts(&[object], crate::store::now()).is_empty();
            assert_eq!(asks, K::COMPLETES_READS, "{}", K::KIND);
        }
        check::<AccessSession>();
        check::<Agent>();
        check::<Enrollment>();
        check::<Revocation>();
    }
}
