//! Label selectors (the full Kubernetes syntax) and field selectors (`=`, `==`, `!=` on the
//! fields a kind supports).

use std::collections::BTreeMap;

use crate::validation::{is_label_value, is_qualified_name};

/// Most requirements in one label selector. kube-apiserver sets no count of its own (only
/// its 1 MiB header limit bounds the URL); every requirement is evaluated against every
/// object a list or watch sees, so this server bounds them.
pub const MAX_LABEL_REQUIREMENTS: usize = 100;

/// Most values in one `in`/`notin` set.
pub const MAX_SET_VALUES: usize = 256;

/// Most terms in one field selector: each kind supports only a handful of fields.
pub const MAX_FIELD_REQUIREMENTS: usize = 32;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed label selector; empty selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelRequirement>);

/// A selector that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse requirement: {0}")]
pub struct SelectorError(pub String);

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),h notin (i),j,!k`.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for term in split_terms(s)? {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            if reqs.len() == MAX_LABEL_REQUIREMENTS {
                return Err(SelectorError(format!(
                    "the label selector has more than {MAX_LABEL_REQUIREMENTS} requirements"
                )));
            }
            reqs.push(parse_requirement(term)?);
        }
        Ok(Self(reqs))
    }

    /// Whether labels satisfy every requirement.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k));
        self.0.iter().all(|r| match r {
            LabelRequirement::Equals(k, v) => get(k) == Some(v),
            LabelRequirement::NotEquals(k, v) => get(k) != Some(v),
            LabelRequirement::In(k, vs) => get(k).is_some_and(|x| vs.contains(x)),
            LabelRequirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(x)),
            LabelRequirement::Exists(k) => get(k).is_some(),
            LabelRequirement::DoesNotExist(k) => get(k).is_none(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

// Splits on commas that are not inside parentheses.
fn split_terms(s: &str) -> Result<Vec<&str>, SelectorError> {
    let mut terms = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(SelectorError(format!("unbalanced ')' in {s:?}")));
                }
            }
            ',' if depth == 0 => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(SelectorError(format!("unbalanced '(' in {s:?}")));
    }
    terms.push(&s[start..]);
    Ok(terms)
}

fn key(k: &str) -> Result<String, SelectorError> {
    let k = k.trim();
    if is_qualified_name(k) {
        Ok(k.to_string())
    } else {
        Err(SelectorError(format!("invalid label key {k:?}")))
    }
}

fn value(v: &str) -> Result<String, SelectorError> {
    let v = v.trim();
    if is_label_value(v) {
        Ok(v.to_string())
    } else {
        Err(SelectorError(format!("invalid label value {v:?}")))
    }
}

fn parse_set(rest: &str) -> Result<Vec<String>, SelectorError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError(format!("expected a set in parentheses, got {rest:?}")))?;
    let count = inner.split(',').count();
    if count > MAX_SET_VALUES {
        return Err(SelectorError(format!(
            "a set in the label selector has {count} values; at most {MAX_SET_VALUES} are allowed"
        )));
    }
    inner.split(',').map(value).collect()
}

fn parse_requirement(term: &str) -> Result<LabelRequirement, SelectorError> {
    if let Some(k) = term.strip_prefix('!') {
        return Ok(LabelRequirement::DoesNotExist(key(k)?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(LabelRequirement::NotEquals(key(k)?, value(v)?));
    }
    if let Some((k, v)) = term.split_once("==") {
        return Ok(LabelRequirement::Equals(key(k)?, value(v)?));
    }
    if let Some((k, v)) = term.split_once('=') {
        return Ok(LabelRequirement::Equals(key(k)?, value(v)?));
    }
    let words: Vec<&str> = term.splitn(2, char::is_whitespace).collect();
    if words.len() == 2 {
        let rest = words[1].trim_start();
        if let Some(set) = rest.strip_prefix("notin") {
            return Ok(LabelRequirement::NotIn(key(words[0])?, parse_set(set)?));
        }
        if let Some(set) = rest.strip_prefix("in") {
            return Ok(LabelRequirement::In(key(words[0])?, parse_set(set)?));
        }
        return Err(SelectorError(format!("unknown operator in {term:?}")));
    }
    Ok(LabelRequirement::Exists(key(term)?))
}

/// One field requirement: `field == value` or `field != value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The field as the client named it (e.g. `spec.server.uid`).
    pub field: String,
    /// Where it lives in the object.
    pub path: &'static [&'static str],
    pub value: String,
    pub negated: bool,
}

/// A parsed field selector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldRequirement>);

impl FieldSelector {
    /// Parses a field selector against the fields a kind supports.
    pub fn parse(
        s: &str,
        supported: &'static [(&'static str, &'static [&'static str])],
    ) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if reqs.len() == MAX_FIELD_REQUIREMENTS {
                return Err(SelectorError(format!(
                    "the field selector has more than {MAX_FIELD_REQUIREMENTS} requirements"
                )));
            }
            let (field, value, negated) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, false)
            } else {
                return Err(SelectorError(format!(
                    "invalid field selector term {term:?}"
                )));
            };
            let field = field.trim();
            let path = supported
                .iter()
                .find(|(name, _)| *name == field)
                .map(|(_, path)| *path)
                .ok_or_else(|| SelectorError(format!("field label not supported: {field}")))?;
            reqs.push(FieldRequirement {
                field: field.to_string(),
                path,
                value: value.trim().to_string(),
                negated,
            });
        }
        Ok(Self(reqs))
    }

    /// Whether a JSON object satisfies every requirement (a missing field reads as "").
    pub fn matches(&self, object: &serde_json::Value) -> bool {
        self.0.iter().all(|r| {
            let mut v = object;
            for seg in r.path {
                v = v.get(seg).unwrap_or(&serde_json::Value::Null);
            }
            let actual = v.as_str().unwrap_or("");
            (actual == r.value) != r.negated
        })
    }

    /// The value a `metadata.name=X` requirement pins, if any.
    pub fn pinned_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|r| r.field == "metadata.name" && !r.negated)
            .map(|r| r.value.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{AccessSession, Kind};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selector_syntax() {
        let s = LabelSelector::parse(
            "app=web, tier!=db,env in (prod, staging),team notin (x),owner,!legacy",
        )
        .unwrap();
        assert_eq!(s.0.len(), 6);
        assert!(s.matches(Some(&labels(&[
            ("app", "web"),
            ("env", "prod"),
            ("owner", "a")
        ]))));
        assert!(!s.matches(Some(&labels(&[
            ("app", "web"),
            ("env", "dev"),
            ("owner", "a")
        ]))));
        assert!(!s.matches(Some(&labels(&[
            ("app", "web"),
            ("env", "prod"),
            ("owner", "a"),
            ("legacy", "")
        ]))));
        assert!(!s.matches(None));
        assert!(LabelSelector::parse("").unwrap().matches(None));
        assert!(LabelSelector::parse("a==b")
            .unwrap()
            .matches(Some(&labels(&[("a", "b")]))));
        for bad in ["a in b", "a in (b", "-a=b", "a=-b", "a foo (b)"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn selector_limits() {
        let terms = |n: usize| {
            (0..n)
                .map(|i| format!("k{i}=v"))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert!(LabelSelector::parse(&terms(MAX_LABEL_REQUIREMENTS)).is_ok());
        let err = LabelSelector::parse(&terms(MAX_LABEL_REQUIREMENTS + 1)).unwrap_err();
        assert!(err.0.contains("more than 100 requirements"), "{err}");
        let set = |n: usize| {
            let values: Vec<String> = (0..n).map(|i| format!("v{i}")).collect();
            format!("k in ({})", values.join(","))
        };
        assert!(LabelSelector::parse(&set(MAX_SET_VALUES)).is_ok());
        assert!(LabelSelector::parse(&set(MAX_SET_VALUES + 1)).is_err());
        assert!(LabelSelector::parse(&set(MAX_SET_VALUES + 1).replace(" in ", " notin ")).is_err());
        let fields = |n: usize| vec!["metadata.name!=x"; n].join(",");
        assert!(
            FieldSelector::parse(&fields(MAX_FIELD_REQUIREMENTS), AccessSession::FIELDS).is_ok()
        );
        let err = FieldSelector::parse(&fields(MAX_FIELD_REQUIREMENTS + 1), AccessSession::FIELDS)
            .unwrap_err();
        assert!(err.0.contains("more than 32 requirements"), "{err}");
    }

    #[test]
    fn field_selector() {
        let f = FieldSelector::parse(
            "spec.server.uid=u1,status.phase!=Revoked",
            AccessSession::FIELDS,
        )
        .unwrap();
        let obj =
            serde_json::json!({"spec": {"server": {"uid": "u1"}}, "status": {"phase": "Active"}});
        assert!(f.matches(&obj));
        let revoked =
            serde_json::json!({"spec": {"server": {"uid": "u1"}}, "status": {"phase": "Revoked"}});
        assert!(!f.matches(&revoked));
        assert!(FieldSelector::parse("spec.nope=1", AccessSession::FIELDS).is_err());
        let n = FieldSelector::parse("metadata.name=x", AccessSession::FIELDS).unwrap();
        assert_eq!(n.pinned_name(), Some("x"));
    }
}
