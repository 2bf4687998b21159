//! Validation of names, labels and annotations as Kubernetes validates them, and the
//! field-error type every validation in this crate reports.

use std::collections::BTreeMap;
use std::fmt;

/// Which rule a field broke; the names are Kubernetes' `StatusCause` reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    Required,
    Invalid,
    Forbidden,
    NotSupported,
    TooLong,
    TooMany,
    Duplicate,
}

impl FieldErrorKind {
    /// The `metav1.CauseType` spelling.
    pub fn cause_type(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Invalid => "FieldValueInvalid",
            Self::Forbidden => "FieldValueForbidden",
            Self::NotSupported => "FieldValueNotSupported",
            Self::TooLong => "FieldValueTooLong",
            Self::TooMany => "FieldValueTooMany",
            Self::Duplicate => "FieldValueDuplicate",
        }
    }
}

/// One invalid field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub kind: FieldErrorKind,
    /// JSON path of the field, e.g. `spec.server.uid`.
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(kind: FieldErrorKind, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind,
            field: field.into(),
            message: message.into(),
        }
    }
    pub fn required(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Required, field, message)
    }
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Invalid, field, message)
    }
    pub fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Forbidden, field, message)
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Joins field errors the way Kubernetes prints them in a Status message.
pub fn join_errors(errors: &[FieldError]) -> String {
    let parts: Vec<String> = errors.iter().map(ToString::to_string).collect();
    if parts.len() == 1 {
        parts[0].clone()
    } else {
        format!("[{}]", parts.join(", "))
    }
}

const DNS1123_SUBDOMAIN_MAX: usize = 253;
const DNS1123_LABEL_MAX: usize = 63;
const QUALIFIED_NAME_MAX: usize = 63;
const LABEL_VALUE_MAX: usize = 63;
const ANNOTATIONS_TOTAL_MAX: usize = 256 * 1024;

fn is_lower_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// A DNS-1123 label: lowercase alphanumerics and '-', alphanumeric at both ends, ≤ 63.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= DNS1123_LABEL_MAX
        && s.chars().all(|c| is_lower_alnum(c) || c == '-')
        && s.starts_with(is_lower_alnum)
        && s.ends_with(is_lower_alnum)
}

/// A DNS-1123 subdomain: dot-separated DNS-1123 labels, ≤ 253 in all.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= DNS1123_SUBDOMAIN_MAX && s.split('.').all(is_dns1123_label_loose)
}

// Subdomain parts follow the label character rules but may be up to the whole length.
fn is_dns1123_label_loose(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| is_lower_alnum(c) || c == '-')
        && s.starts_with(is_lower_alnum)
        && s.ends_with(is_lower_alnum)
}

/// Validates an object name (DNS-1123 subdomain, as for most Kubernetes kinds).
pub fn validate_object_name(name: &str, field: &str) -> Vec<FieldError> {
    if name.is_empty() {
        return vec![FieldError::required(
            field,
            "name or generateName is required",
        )];
    }
    if !is_dns1123_subdomain(name) {
        return vec![FieldError::invalid(
            field,
            format!(
                "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case \
                 alphanumeric characters, '-' or '.', and must start and end with an alphanumeric \
                 character (at most {DNS1123_SUBDOMAIN_MAX} characters)"
            ),
        )];
    }
    Vec::new()
}

/// Validates a namespace name (DNS-1123 label).
pub fn validate_namespace_name(ns: &str, field: &str) -> Vec<FieldError> {
    if is_dns1123_label(ns) {
        Vec::new()
    } else {
        vec![FieldError::invalid(
            field,
            format!("Invalid value: {ns:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (at most {DNS1123_LABEL_MAX} characters)"),
        )]
    }
}

fn is_name_part(s: &str, max: usize) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= max
        && s.chars()
            .all(|c| alnum(c) || c == '-' || c == '_' || c == '.')
        && s.starts_with(alnum)
        && s.ends_with(alnum)
}

/// A qualified name: `[prefix/]name`, the syntax of label and annotation keys.
pub fn is_qualified_name(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => {
            is_dns1123_subdomain(prefix) && is_name_part(name, QUALIFIED_NAME_MAX)
        }
        None => is_name_part(key, QUALIFIED_NAME_MAX),
    }
}

/// A label value: empty, or ≤ 63 alphanumerics with '-', '_' and '.' inside.
pub fn is_label_value(v: &str) -> bool {
    v.is_empty() || is_name_part(v, LABEL_VALUE_MAX)
}

/// Validates `metadata.labels`.
pub fn validate_labels(labels: &BTreeMap<String, String>, field: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (k, v) in labels {
        if !is_qualified_name(k) {
            errors.push(FieldError::invalid(
                field,
                format!("Invalid value: {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, with an optional DNS subdomain prefix and '/'"),
            ));
        }
        if !is_label_value(v) {
            errors.push(FieldError::invalid(
                field,
                format!("Invalid value: {v:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most {LABEL_VALUE_MAX} characters)"),
            ));
        }
    }
    errors
}

/// Validates `metadata.annotations`.
pub fn validate_annotations(
    annotations: &BTreeMap<String, String>,
    field: &str,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut total = 0usize;
    for (k, v) in annotations {
        total += k.len() + v.len();
        if !is_qualified_name(&k.to_ascii_lowercase()) {
            errors.push(FieldError::invalid(
                field,
                format!("Invalid value: {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, with an optional DNS subdomain prefix and '/'"),
            ));
        }
    }
    if total > ANNOTATIONS_TOTAL_MAX {
        errors.push(FieldError::new(
            FieldErrorKind::TooLong,
            field,
            format!("Too long: may not be more than {ANNOTATIONS_TOTAL_MAX} bytes"),
        ));
    }
    errors
}

/// Finalizers Kubernetes defines without a domain prefix; every other finalizer must be
/// domain-qualified (`example.com/name`), as kube-apiserver requires.
pub const STANDARD_FINALIZERS: &[&str] = &["kubernetes", "orphan", "foregroundDeletion"];

/// Validates `metadata.finalizers` as kube-apiserver does: each a qualified name, either
/// standard or domain-qualified, and not both `orphan` and `foregroundDeletion`.
pub fn validate_finalizers(finalizers: &[String], field: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (i, f) in finalizers.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if !is_qualified_name(f) {
            errors.push(FieldError::invalid(
                at,
                format!("Invalid value: {f:?}: a finalizer must be a qualified name: an optional DNS subdomain prefix and '/', and a name part of alphanumeric characters, '-', '_' or '.' that starts and ends with an alphanumeric character (at most {QUALIFIED_NAME_MAX} characters)"),
            ));
        } else if !f.contains('/') && !STANDARD_FINALIZERS.contains(&f.as_str()) {
            errors.push(FieldError::invalid(
                at,
                format!("Invalid value: {f:?}: name is neither a standard finalizer name nor is it fully qualified"),
            ));
        }
    }
    let has = |name: &str| finalizers.iter().any(|f| f == name);
    if has("orphan") && has("foregroundDeletion") {
        errors.push(FieldError::invalid(
            field,
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    errors
}

/// The fields of an owner reference that validation reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerRef<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub controller: bool,
}

/// Validates `metadata.ownerReferences` as kube-apiserver does: apiVersion (with a
/// version), kind, name and uid present, no Event owners, at most one controller.
pub fn validate_owner_references(refs: &[OwnerRef<'_>], field: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut controller: Option<String> = None;
    for (i, r) in refs.iter().enumerate() {
        let at = |child: &str| format!("{field}[{i}].{child}");
        // `group/version` or a bare `version`; anything else has no version.
        let (group, version) = match r.api_version.split('/').collect::<Vec<_>>().as_slice() {
            [version] => ("", *version),
            [group, version] => (*group, *version),
            _ => ("", ""),
        };
        if version.is_empty() {
            errors.push(FieldError::invalid(
                at("apiVersion"),
                format!(
                    "Invalid value: {:?}: version must not be empty",
                    r.api_version
                ),
            ));
        }
        if r.kind.is_empty() {
            errors.push(FieldError::invalid(
                at("kind"),
                "Invalid value: \"\": must not be empty",
            ));
        }
        if r.name.is_empty() {
            errors.push(FieldError::invalid(
                at("name"),
                "Invalid value: \"\": must not be empty",
            ));
        }
        if r.uid.is_empty() {
            errors.push(FieldError::invalid(
                at("uid"),
                "Invalid value: \"\": must not be empty",
            ));
        }
        if group.is_empty() && version == "v1" && r.kind == "Event" {
            errors.push(FieldError::invalid(
                format!("{field}[{i}]"),
                "/v1, Kind=Event is disallowed from being an owner",
            ));
        }
        if r.controller {
            let this = format!("{}/{}", r.kind, r.name);
            match &controller {
                Some(first) => errors.push(FieldError::invalid(
                    field,
                    format!("Only one reference can have Controller set to true. Found \"true\" in references for {first} and {this}"),
                )),
                None => controller = Some(this),
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizers() {
        let ok: Vec<String> = ["kubernetes", "example.com/cleanup", "mcp-runtime.dev/x_y.z"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(validate_finalizers(&ok, "metadata.finalizers").is_empty());
        for bad in [
            "cleanup",
            "-x/y",
            "example.com/",
            "Example.com/a",
            "a/b/c",
            "",
        ] {
            let errors = validate_finalizers(&[bad.to_string()], "metadata.finalizers");
            assert_eq!(errors.len(), 1, "{bad:?}: {errors:?}");
            assert_eq!(errors[0].field, "metadata.finalizers[0]");
        }
        let long = format!("example.com/{}", "a".repeat(64));
        assert_eq!(validate_finalizers(&[long], "f").len(), 1);
        let both = vec!["orphan".to_string(), "foregroundDeletion".to_string()];
        assert_eq!(validate_finalizers(&both, "f")[0].field, "f");
    }

    #[test]
    fn owner_references() {
        let good = OwnerRef {
            api_version: "apps/v1",
            kind: "Deployment",
            name: "web",
            uid: "u1",
            controller: true,
        };
        assert!(validate_owner_references(std::slice::from_ref(&good), "o").is_empty());
        let core = OwnerRef {
            api_version: "v1",
            kind: "ConfigMap",
            ..good.clone()
        };
        assert!(validate_owner_references(&[core], "o").is_empty());
        let empty = OwnerRef::default();
        let fields: Vec<String> = validate_owner_references(&[empty], "o")
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            ["o[0].apiVersion", "o[0].kind", "o[0].name", "o[0].uid"]
        );
        let no_version = OwnerRef {
            api_version: "a/b/c",
            ..good.clone()
        };
        assert_eq!(validate_owner_references(&[no_version], "o").len(), 1);
        let event = OwnerRef {
            api_version: "v1",
            kind: "Event",
            ..good.clone()
        };
        assert_eq!(validate_owner_references(&[event], "o").len(), 1);
        let second = OwnerRef {
            name: "other",
            ..good.clone()
        };
        let errors = validate_owner_references(&[good.clone(), second.clone()], "o");
        assert_eq!(errors.len(), 1);
        assert!(errors[0].message.contains("Only one reference"));
        let not_controller = OwnerRef {
            controller: false,
            ..second
        };
        assert!(validate_owner_references(&[good, not_controller], "o").is_empty());
    }

    #[test]
    fn names() {
        assert!(is_dns1123_subdomain("alice-github"));
        assert!(is_dns1123_subdomain("a.b-c.d"));
        assert!(!is_dns1123_subdomain("Alice"));
        assert!(!is_dns1123_subdomain("-a"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        assert!(is_dns1123_subdomain(&"a".repeat(253)));
        assert!(is_dns1123_label("default"));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert_eq!(
            validate_object_name("", "metadata.name")[0].kind,
            FieldErrorKind::Required
        );
    }

    #[test]
    fn labels_and_annotations() {
        let ok: BTreeMap<_, _> = [
            ("app".to_string(), "x".to_string()),
            ("mcp-runtime.dev/server".to_string(), "".to_string()),
            ("a_b.c".to_string(), "V_1.2-3".to_string()),
        ]
        .into();
        assert!(validate_labels(&ok, "metadata.labels").is_empty());
        for (k, v) in [
            ("-a", "x"),
            ("a/", "x"),
            ("UP.per/a", "x"),
            ("a", "-x"),
            ("a", &"v".repeat(64)),
        ] {
            let bad: BTreeMap<_, _> = [(k.to_string(), v.to_string())].into();
            assert!(
                !validate_labels(&bad, "metadata.labels").is_empty(),
                "{k}={v}"
            );
        }
        let big: BTreeMap<_, _> = [("a".to_string(), "x".repeat(300 * 1024))].into();
        assert_eq!(
            validate_annotations(&big, "metadata.annotations")[0].kind,
            FieldErrorKind::TooLong
        );
    }
}
