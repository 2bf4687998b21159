//! MCP transport framing the gateway needs (no policy): JSON-RPC messages and batches of a POST
//! body, and the 2026-07-28 routing-header check (`Mcp-Method`/`Mcp-Name` against the body,
//! error -32020 on a mismatch), as the Python SDK's `mcp/shared/inbound.py` has it.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use http::HeaderMap;
use serde_json::Value;

/// JSON-RPC error code of a routing header that disagrees with the body (2026-07-28).
pub const HEADER_MISMATCH: i64 = -32020;
/// The first protocol revision with routing headers and stateless POSTs.
pub const MODERN_PROTOCOL: &str = "2026-07-28";
/// Header names.
pub const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";
pub const METHOD_HEADER: &str = "mcp-method";
pub const NAME_HEADER: &str = "mcp-name";
pub const SESSION_ID_HEADER: &str = "mcp-session-id";

/// Method → the params key mirrored in `Mcp-Name`.
pub const NAME_BEARING_METHODS: [(&str, &str); 3] = [
    ("tools/call", "name"),
    ("prompts/get", "name"),
    ("resources/read", "uri"),
];

/// JSON-RPC error code of a `tools/call` the session's `spec.tools` does not grant.
pub const TOOL_NOT_GRANTED: i64 = -32030;
/// Its reason, in the error's `data.reason` and the refusal metric.
pub const TOOL_NOT_GRANTED_REASON: &str = "tool_not_granted";
/// JSON-RPC error codes of the ToolPolicy refusals (reasons from
/// [`apis::tool_policy::PolicyReason`]), and of a call made before the gateway holds its
/// server's policies (`policy_not_ready`).
pub const DESTRUCTIVE_NOT_ALLOWED: i64 = -32031;
pub const ARGUMENT_NOT_ALLOWED: i64 = -32032;
pub const POLICY_NOT_READY: i64 = -32033;
pub const POLICY_NOT_READY_REASON: &str = "policy_not_ready";
/// JSON-RPC error code of a call past a rate limit (answered with HTTP 429 and `Retry-After`).
pub const RATE_LIMITED: i64 = -32034;
pub const RATE_LIMITED_REASON: &str = "rate_limited";
/// JSON-RPC error code of a call of a pinned tool the server now lists with another definition.
pub const TOOL_CHANGED: i64 = -32035;
/// Every reason a call may be refused for, as metrics label them.
pub const CALL_REASONS: [&str; 6] = [
    TOOL_NOT_GRANTED_REASON,
    "destructive_not_allowed",
    "argument_not_allowed",
    POLICY_NOT_READY_REASON,
    RATE_LIMITED_REASON,
    "tool_changed",
];
/// Every reason a monitor-mode policy may record a call for.
pub const MONITORED_REASONS: [&str; 4] = [
    "destructive_not_allowed",
    "argument_not_allowed",
    RATE_LIMITED_REASON,
    "tool_changed",
];

/// A JSON-RPC request id (a string, a number, or null when unknown).
pub type RequestId = Value;

/// What a POST body holds, as far as the gateway cares.
#[derive(Clone, Debug, PartialEq)]
pub struct Posted {
    /// The decoded body; `None` when it is not JSON (the upstream answers that).
    pub messages: Vec<Value>,
    /// Whether the body was a JSON array (a batch).
    pub batch: bool,
}

impl Posted {
    /// Decodes a POST body. Not JSON, or JSON that is neither an object nor an array, gives no
    /// messages.
    pub fn parse(body: &[u8]) -> Self {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Array(items)) => Self {
                messages: items,
                batch: true,
            },
            Ok(obj @ Value::Object(_)) => Self {
                messages: vec![obj],
                batch: false,
            },
            _ => Self {
                messages: vec![],
                batch: false,
            },
        }
    }

    /// The ids of the requests (messages with a `method` and an `id`): the ones a response
    /// stream owes an answer to.
    pub fn request_ids(&self) -> Vec<RequestId> {
        self.messages
            .iter()
            .filter(|m| m.get("method").is_some())
            .filter_map(|m| m.get("id").cloned())
            .collect()
    }
}

/// Whether a JSON body holds an object with the same key twice, at any depth. JSON parsers
/// differ on which value wins (serde_json, Python, Go and JavaScript keep the last, others the
/// first or refuse), so for a session whose calls are checked the gateway refuses such a body
/// rather than judge one value while the server reads another. `false` for a body that is not
/// JSON (judged apart).
pub fn has_duplicate_keys(body: &[u8]) -> bool {
    use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

    /// Any JSON value, refusing a repeated key in its objects.
    struct Unique;

    impl<'de> Deserialize<'de> for Unique {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(UniqueVisitor)
        }
    }

    struct UniqueVisitor;

    impl<'de> Visitor<'de> for UniqueVisitor {
        type Value = Unique;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_unit<E>(self) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
            while seq.next_element::<Unique>()?.is_some() {}
            Ok(Unique)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if !seen.insert(key.into_owned()) {
                    return Err(serde::de::Error::custom("duplicate key"));
                }
                map.next_value::<Unique>()?;
            }
            Ok(Unique)
        }
    }

    let mut de = serde_json::Deserializer::from_slice(body);
    match Unique::deserialize(&mut de) {
        Ok(Unique) => false,
        // Only a repeated key counts; other errors are the parser's to report.
        Err(e) => {
            e.to_string().starts_with("duplicate key")
                && serde_json::from_slice::<IgnoredAny>(body).is_ok()
        }
    }
}

/// A routing-header check that failed: answered 400 with a JSON-RPC error.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    pub id: RequestId,
    pub message: String,
}

impl Mismatch {
    /// The JSON-RPC error response body.
    pub fn body(&self) -> Value {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": HEADER_MISMATCH, "message": self.message},
        })
    }
}

/// Whether the request speaks 2026-07-28 or later (its `MCP-Protocol-Version` is a date at
/// or after it; dates compare as strings) or carries an `Mcp-Method` header.
pub fn is_modern(headers: &HeaderMap) -> bool {
    let version_modern = headers
        .get(PROTOCOL_VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.len() == MODERN_PROTOCOL.len() && v >= MODERN_PROTOCOL);
    version_modern || headers.contains_key(METHOD_HEADER)
}

/// The inverse of the SDK's header-value encoding: `=?base64?…?=` carries UTF-8 that a header
/// cannot; a malformed or non-canonical one decodes to nothing (so it never matches).
pub fn decode_header_value(raw: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(raw).ok()?;
    match text
        .strip_prefix("=?base64?")
        .and_then(|t| t.strip_suffix("?="))
    {
        None => Some(text.to_string()),
        Some(payload) => {
            let bytes = STANDARD.decode(payload).ok()?;
            if STANDARD.encode(&bytes) != payload {
                return None;
            }
            String::from_utf8(bytes).ok()
        }
    }
}

/// The SDK's header-value encoding: printable ASCII without edge whitespace as is, anything
/// else base64-wrapped.
pub fn encode_header_value(value: &str) -> String {
    let plain = value.bytes().all(|b| (0x20..=0x7e).contains(&b))
        && value == value.trim()
        && !(value.starts_with("=?base64?") && value.ends_with("?="));
    if plain {
        value.to_string()
    } else {
        format!("=?base64?{}?=", STANDARD.encode(value.as_bytes()))
    }
}

/// The ids of the `tools/list` requests of a POST: the answers whose tools are filtered.
pub fn tools_list_ids(posted: &Posted) -> Vec<RequestId> {
    posted
        .messages
        .iter()
        .filter(|m| m.get("method").and_then(Value::as_str) == Some("tools/list"))
        .filter_map(|m| m.get("id").cloned())
        .collect()
}

/// Drops from a JSON-RPC answer (or a batch of them) to one of the `tools/list` requests
/// `ids` every tool `granted` refuses (given its name and its whole entry). Returns whether
/// anything was dropped.
pub fn filter_tools_list(
    message: &mut Value,
    ids: &[RequestId],
    granted: &dyn Fn(&str, &Value) -> bool,
) -> bool {
    if let Value::Array(items) = message {
        let mut changed = false;
        for item in items {
            changed |= filter_tools_list(item, ids, granted);
        }
        return changed;
    }
    let answers_a_list = message.get("id").is_some_and(|id| ids.contains(id));
    let Some(Value::Array(tools)) = message
        .pointer_mut("/result/tools")
        .filter(|_| answers_a_list)
    else {
        return false;
    };
    let before = tools.len();
    tools.retain(|tool| {
        tool.get("name")
            .and_then(Value::as_str)
            .is_some_and(|name| granted(name, tool))
    });
    tools.len() != before
}

/// Why a `tools/call` is answered with an error instead of being forwarded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// `tool_not_granted`, `destructive_not_allowed`, `argument_not_allowed` or
    /// `policy_not_ready`: the error's `data.reason`, the audit line's and the metric's.
    pub reason: &'static str,
    /// The JSON-RPC error code (one per reason).
    pub code: i64,
    /// For the caller: the tool and, from a policy, the policy and argument at fault.
    pub message: String,
    /// The ToolPolicy that refuses it, if one does.
    pub policy: Option<String>,
}

impl Refused {
    /// The session's `spec.tools` does not grant the tool.
    pub fn not_granted(tool: &str) -> Self {
        Self {
            reason: TOOL_NOT_GRANTED_REASON,
            code: TOOL_NOT_GRANTED,
            message: format!("this session may not call tool {tool:?}"),
            policy: None,
        }
    }
}

/// What the gateway decided for one call: refused or not, and what policies said of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallOutcome {
    pub refused: Option<Refused>,
    /// The strictest side effect a matching policy rule declares.
    pub side_effect: Option<apis::SideEffect>,
    /// What `monitor` policies would have refused: forwarded, counted and audited.
    pub monitored: Vec<apis::tool_policy::Finding>,
    /// The rate limits of the policy rules it matches.
    pub limits: Vec<apis::tool_policy::RuleLimit>,
}

/// The decision on one `tools/call` of a POST body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallDecision {
    /// Where the call stands in the body's messages.
    pub index: usize,
    /// Its `params.name` (empty when it has none).
    pub tool: String,
    pub outcome: CallOutcome,
}

impl CallDecision {
    pub fn granted(&self) -> bool {
        self.outcome.refused.is_none()
    }
}

/// The `tools/call` requests of a POST and what `decide` makes of each (given the tool and
/// the call's `params.arguments` when it is an object). A call without a string
/// `params.name` is refused as not granted (it cannot be shown to be).
pub fn decide_calls(
    posted: &Posted,
    decide: impl Fn(&str, Option<&serde_json::Map<String, Value>>) -> CallOutcome,
) -> Vec<CallDecision> {
    posted
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.get("method").and_then(Value::as_str) == Some("tools/call"))
        .map(|(index, m)| {
            let name = m.pointer("/params/name").and_then(Value::as_str);
            let arguments = m.pointer("/params/arguments").and_then(Value::as_object);
            let outcome = match name {
                Some(tool) => decide(tool, arguments),
                None => CallOutcome {
                    refused: Some(Refused::not_granted("")),
                    ..Default::default()
                },
            };
            CallDecision {
                index,
                tool: name.unwrap_or_default().to_string(),
                outcome,
            }
        })
        .collect()
}

/// Decides the calls of a body by the session's tool grant alone and returns the refusal,
/// if any (see [`refusal`]).
pub fn refuse_ungranted_calls(posted: &Posted, granted: impl Fn(&str) -> bool) -> Option<Value> {
    let calls = decide_calls(posted, |tool, _| CallOutcome {
        refused: (!granted(tool)).then(|| Refused::not_granted(tool)),
        ..Default::default()
    });
    refusal(posted, &calls)
}

/// The answer to a body holding a refused `tools/call`: the whole body is held back (a batch
/// is not split), each request answered with a JSON-RPC error — the refused calls with their
/// reason, the others saying why they were not forwarded. `None` when every call passes.
pub fn refusal(posted: &Posted, calls: &[CallDecision]) -> Option<Value> {
    let first = calls.iter().find_map(|c| c.outcome.refused.as_ref())?;
    let refused = |index: usize| {
        calls
            .iter()
            .find(|c| c.index == index)
            .and_then(|c| c.outcome.refused.as_ref().map(|r| (c.tool.as_str(), r)))
    };
    let answers: Vec<Value> = posted
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.get("method").is_some() && m.get("id").is_some())
        .map(|(index, m)| {
            let id = m.get("id").cloned().unwrap_or(Value::Null);
            let error = match refused(index) {
                Some((tool, r)) => {
                    let mut data = serde_json::json!({"reason": r.reason, "tool": tool});
                    if let Some(policy) = &r.policy {
                        data["policy"] = Value::String(policy.clone());
                    }
                    serde_json::json!({
                        "code": r.code,
                        "message": format!("{}: {}", r.reason, r.message),
                        "data": data,
                    })
                }
                None => serde_json::json!({
                    "code": first.code,
                    "message": "not forwarded: the batch holds a tools/call this session may not make",
                    "data": {"reason": first.reason},
                }),
            };
            serde_json::json!({"jsonrpc": "2.0", "id": id, "error": error})
        })
        .collect();
    Some(if posted.batch {
        Value::Array(answers)
    } else {
        answers.into_iter().next().unwrap_or_else(|| {
            serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {"code": first.code, "message": first.reason}})
        })
    })
}

/// The 2026-07-28 routing-header check of a POST: a routing header given twice, an
/// `Mcp-Method` other than the body's method, or (for tools/call, prompts/get,
/// resources/read) an `Mcp-Name` other than the body's name is a mismatch. Only modern
/// requests ([`is_modern`]) are checked; a batch under a modern header has no single method
/// to agree with and is a mismatch too.
pub fn check_routing_headers(headers: &HeaderMap, posted: &Posted) -> Result<(), Mismatch> {
    if !is_modern(headers) {
        return Ok(());
    }
    let first_id = posted
        .messages
        .first()
        .and_then(|m| m.get("id").cloned())
        .unwrap_or(Value::Null);
    let mismatch = |id: &Value, message: String| Mismatch {
        id: id.clone(),
        message,
    };
    for name in [PROTOCOL_VERSION_HEADER, METHOD_HEADER, NAME_HEADER] {
        if headers.get_all(name).iter().count() > 1 {
            return Err(mismatch(
                &first_id,
                format!("{name} header appears more than once"),
            ));
        }
    }
    if posted.batch {
        return Err(mismatch(
            &Value::Null,
            "a batch cannot carry routing headers".into(),
        ));
    }
    let Some(message) = posted.messages.first() else {
        return Ok(()); // not JSON: the upstream answers with a parse error
    };
    let Some(method) = message.get("method") else {
        return Ok(()); // a response to a server request
    };
    let header_method = headers
        .get(METHOD_HEADER)
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok());
    if header_method.is_none() || method.as_str() != header_method {
        return Err(mismatch(
            &first_id,
            format!("{METHOD_HEADER} header does not match the request body's method"),
        ));
    }
    let name_key = NAME_BEARING_METHODS
        .iter()
        .find(|(m, _)| Some(*m) == method.as_str())
        .map(|(_, k)| *k);
    if let Some(key) = name_key {
        let body_value = message.get("params").and_then(|p| p.get(key));
        if let Some(body_value) = body_value.filter(|v| !v.is_null()) {
            let header = headers
                .get(NAME_HEADER)
                .and_then(|v| decode_header_value(v.as_bytes()));
            if header.as_deref() != body_value.as_str() {
                return Err(mismatch(
                    &first_id,
                    format!(
                        "{NAME_HEADER} header does not match the request body's {key:?} parameter"
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use serde_json::json;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn call(name: &str) -> Posted {
        Posted::parse(
            json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":name,"arguments":{}}})
                .to_string()
                .as_bytes(),
        )
    }

    const V: (&str, &str) = ("mcp-protocol-version", "2026-07-28");

    #[test]
    fn repeated_keys_are_found_at_any_depth() {
        for (body, repeated) in [
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{}}}"#,
                false,
            ),
            (r#"{"params":{"name":"destructive","name":"search"}}"#, true),
            (r#"[{"a":1},{"b":{"c":[{"d":1,"d":2}]}}]"#, true),
            (r#"{"a":{"x":1},"b":{"x":1}}"#, false),
            (r#"{"a\u0062":1,"ab":2}"#, true),
            ("not json", false),
        ] {
            assert_eq!(has_duplicate_keys(body.as_bytes()), repeated, "{body}");
        }
    }

    #[test]
    fn matching_headers_pass() {
        let h = headers(&[V, ("mcp-method", "tools/call"), ("Mcp-Name", "search")]);
        assert_eq!(check_routing_headers(&h, &call("search")), Ok(()));
        let ping = Posted::parse(br#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#);
        assert_eq!(
            check_routing_headers(&headers(&[V, ("mcp-method", "ping")]), &ping),
            Ok(())
        );
        // Non-ASCII names travel base64-wrapped.
        let h = headers(&[
            V,
            ("mcp-method", "tools/call"),
            ("mcp-name", &encode_header_value("suche-ä")),
        ]);
        assert_eq!(check_routing_headers(&h, &call("suche-ä")), Ok(()));
    }

    #[test]
    fn mismatches_are_32020_with_the_request_id() {
        for h in [
            headers(&[V, ("mcp-method", "tools/list"), ("mcp-name", "search")]),
            headers(&[V, ("mcp-name", "search")]),
            headers(&[V, ("mcp-method", "tools/call"), ("mcp-name", "delete")]),
            headers(&[V, ("mcp-method", "tools/call")]),
            headers(&[
                V,
                ("mcp-method", "tools/call"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "search"),
            ]),
            headers(&[
                V,
                ("mcp-method", "tools/call"),
                ("mcp-name", "=?base64?!!?="),
            ]),
        ] {
            let err = check_routing_headers(&h, &call("search")).unwrap_err();
            assert_eq!(err.id, json!(7), "{h:?}");
            assert_eq!(err.body()["error"]["code"], json!(-32020));
        }
        let batch = Posted::parse(br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#);
        assert!(check_routing_headers(&headers(&[V, ("mcp-method", "ping")]), &batch).is_err());
        let uri = Posted::parse(
            br#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a"}}"#,
        );
        let h = headers(&[
            V,
            ("mcp-method", "resources/read"),
            ("mcp-name", "file:///b"),
        ]);
        assert!(check_routing_headers(&h, &uri).is_err());
    }

    #[test]
    fn older_protocols_are_not_checked() {
        let h = headers(&[
            ("mcp-protocol-version", "2025-11-25"),
            ("mcp-name", "other"),
        ]);
        assert_eq!(check_routing_headers(&h, &call("search")), Ok(()));
        assert!(!is_modern(&headers(&[(
            "mcp-protocol-version",
            "2025-03-26"
        )])));
        assert!(is_modern(&headers(&[(
            "mcp-protocol-version",
            "2026-07-28"
        )])));
        assert!(!is_modern(&headers(&[(
            "mcp-protocol-version",
            "2026-07-28x"
        )])));
        assert!(is_modern(&headers(&[("mcp-method", "ping")])));
    }

    #[test]
    fn bodies_and_ids() {
        let p = Posted::parse(br#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":2,"result":{}}]"#);
        assert!(p.batch);
        assert_eq!(p.request_ids(), vec![json!(1)]);
        assert_eq!(Posted::parse(b"nope").messages.len(), 0);
        assert_eq!(Posted::parse(b"42").messages.len(), 0);
        assert_eq!(decode_header_value(b"=?base64?YQ==?="), Some("a".into()));
        assert_eq!(
            decode_header_value(b"=?base64?YR==?="),
            None,
            "non-canonical"
        );
        assert_eq!(encode_header_value(" a"), "=?base64?IGE=?=");
    }

    #[test]
    fn ungranted_calls_are_answered_and_the_whole_body_is_held_back() {
        let granted = |t: &str| t == "search";
        assert_eq!(refuse_ungranted_calls(&call("search"), granted), None);
        let one = refuse_ungranted_calls(&call("delete"), granted).unwrap();
        assert_eq!(one["id"], 7);
        assert_eq!(one["error"]["code"], TOOL_NOT_GRANTED);
        assert_eq!(one["error"]["data"]["reason"], "tool_not_granted");
        assert_eq!(one["error"]["data"]["tool"], "delete");
        // Other methods are not this check's business.
        let list = Posted::parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        assert_eq!(refuse_ungranted_calls(&list, |_| false), None);
        // A batch with one refused call: every request answered, the notification not.
        let batch = Posted::parse(
            br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search"}},
                 {"jsonrpc":"2.0","method":"notifications/progress"},
                 {"jsonrpc":"2.0","id":"b","method":"tools/call","params":{"name":"delete"}}]"#,
        );
        let answers = refuse_ungranted_calls(&batch, granted).unwrap();
        let answers = answers.as_array().unwrap();
        assert_eq!(answers.len(), 2);
        assert_eq!(answers[0]["id"], 1);
        assert!(answers[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("batch"));
        assert_eq!(answers[1]["id"], "b");
        assert_eq!(answers[1]["error"]["data"]["tool"], "delete");
        // No name: refused, since it cannot be shown to be granted.
        let nameless =
            Posted::parse(br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{}}"#);
        assert!(refuse_ungranted_calls(&nameless, |_| true).is_some());
    }

    #[test]
    fn tools_list_answers_keep_only_granted_tools() {
        let posted = Posted::parse(
            br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"ping"}]"#,
        );
        let ids = tools_list_ids(&posted);
        assert_eq!(ids, vec![json!(1)]);
        let granted = |t: &str| t == "search" || t.starts_with("issues_");
        let mut answer = json!({"jsonrpc":"2.0","id":1,"result":{"tools":[
            {"name":"search"},{"name":"delete_repo"},{"name":"issues_close"},{"description":"nameless"}
        ]}});
        assert!(filter_tools_list(&mut answer, &ids, &|t, _| granted(t)));
        let names: Vec<&str> = answer["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["search", "issues_close"]);
        // Another request's answer, or one without tools, is left alone.
        let mut other = json!({"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"x"}]}});
        assert!(!filter_tools_list(&mut other, &ids, &|t, _| granted(t)));
        assert_eq!(other["result"]["tools"][0]["name"], "x");
        let mut batch = json!([{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"x"}]}}]);
        assert!(filter_tools_list(&mut batch, &ids, &|t, _| granted(t)));
        assert_eq!(batch[0]["result"]["tools"], json!([]));
    }
}
