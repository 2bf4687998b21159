//! The Host API's flags and their validation. Everything here is checked before any I/O but
//! reading the named files: a missing, malformed or placeholder setting stops startup naming
//! the flag, never printing key material.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use apis::duration::GoDuration;
use base64::Engine;

/// Default of `--host-token-max-ttl`.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(600);
/// Default of `--host-api-rate-limit`.
pub const DEFAULT_RATE_LIMIT: u32 = 120;
/// Default of `--host-api-rate-window`.
pub const DEFAULT_RATE_WINDOW: Duration = Duration::from_secs(60);
/// The smallest RSA modulus accepted for the host token issuer's key.
pub const MIN_RSA_BITS: usize = 2048;
/// The largest, as ring (which verifies the signatures) allows.
pub const MAX_RSA_BITS: usize = 8192;

/// Flags of the Host API. It is on only when `--host-api-port` is set; any other of these
/// flags without it is a startup error.
#[derive(Debug, Clone, Default, clap::Args)]
#[group(id = "host_api")]
pub struct Args {
    /// Port of the Host API (HTTPS, all addresses). The Host API is off without it.
    #[arg(long, env = "MCP_ACCESS_HOST_API_PORT")]
    pub host_api_port: Option<u16>,
    /// Serving certificate (PEM chain) of the Host API; reloaded when the file changes.
    #[arg(long, env = "MCP_ACCESS_HOST_API_TLS_CERT_FILE")]
    pub host_api_tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of the Host API's serving certificate.
    #[arg(long, env = "MCP_ACCESS_HOST_API_TLS_KEY_FILE")]
    pub host_api_tls_key_file: Option<PathBuf>,
    /// The host token issuer's RSA public key (PEM `PUBLIC KEY` or `RSA PUBLIC KEY`, 2048 to
    /// 8192 bits). Host tokens are RS256 JWTs signed with its private key.
    #[arg(long, env = "MCP_ACCESS_HOST_TOKEN_PUBLIC_KEY_FILE")]
    pub host_token_public_key_file: Option<PathBuf>,
    /// The `iss` host tokens must carry.
    #[arg(long, env = "MCP_ACCESS_HOST_TOKEN_ISSUER")]
    pub host_token_issuer: Option<String>,
    /// The audience set host tokens must carry exactly (repeatable or comma-separated).
    #[arg(long, env = "MCP_ACCESS_HOST_TOKEN_AUDIENCE", value_delimiter = ',')]
    pub host_token_audience: Vec<String>,
    /// The longest lifetime (`exp - iat`) a host token may have (Go duration) [default: 600s].
    #[arg(long, env = "MCP_ACCESS_HOST_TOKEN_MAX_TTL")]
    pub host_token_max_ttl: Option<GoDuration>,
    /// Requests each Host may make per rate window, counted after authentication
    /// [default: 120].
    #[arg(long, env = "MCP_ACCESS_HOST_API_RATE_LIMIT")]
    pub host_api_rate_limit: Option<u32>,
    /// The fixed rate window (Go duration) [default: 1m].
    #[arg(long, env = "MCP_ACCESS_HOST_API_RATE_WINDOW")]
    pub host_api_rate_window: Option<GoDuration>,
}

/// The checked settings of an enabled Host API.
#[derive(Clone)]
pub struct Settings {
    pub port: u16,
    pub tls_cert_file: PathBuf,
    pub tls_key_file: PathBuf,
    /// The issuer's key, as PKCS#1 DER.
    pub public_key_der: Vec<u8>,
    pub issuer: String,
    pub audience: BTreeSet<String>,
    pub max_ttl: Duration,
    pub rate_limit: u32,
    pub rate_window: Duration,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("port", &self.port)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("max_ttl", &self.max_ttl)
            .field("rate_limit", &self.rate_limit)
            .field("rate_window", &self.rate_window)
            .finish_non_exhaustive()
    }
}

/// A Host API setting that stops startup; the message names the flag.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {message}")]
pub struct SettingError {
    pub flag: &'static str,
    pub message: String,
}

fn err(flag: &'static str, message: impl Into<String>) -> SettingError {
    SettingError {
        flag,
        message: message.into(),
    }
}

impl Args {
    /// The settings, `None` when the Host API is off, or the first bad setting.
    pub fn settings(&self) -> Result<Option<Settings>, SettingError> {
        let Some(port) = self.host_api_port else {
            if let Some(flag) = self.first_given() {
                return Err(err(
                    flag,
                    "given without --host-api-port (the Host API is off without a port)",
                ));
            }
            return Ok(None);
        };
        let tls_cert_file = self
            .host_api_tls_cert_file
            .clone()
            .ok_or_else(|| err("--host-api-tls-cert-file", "required with --host-api-port"))?;
        let tls_key_file = self
            .host_api_tls_key_file
            .clone()
            .ok_or_else(|| err("--host-api-tls-key-file", "required with --host-api-port"))?;
        let key_flag = "--host-token-public-key-file";
        let key_path = self
            .host_token_public_key_file
            .as_deref()
            .ok_or_else(|| err(key_flag, "required with --host-api-port"))?;
        let public_key_der = load_public_key(key_path).map_err(|m| err(key_flag, m))?;
        let issuer = self
            .host_token_issuer
            .as_deref()
            .ok_or_else(|| err("--host-token-issuer", "required with --host-api-port"))?;
        check_claim_value(issuer).map_err(|m| err("--host-token-issuer", m))?;
        let mut audience = BTreeSet::new();
        for a in &self.host_token_audience {
            check_claim_value(a).map_err(|m| err("--host-token-audience", m))?;
            audience.insert(a.clone());
        }
        if audience.is_empty() {
            return Err(err(
                "--host-token-audience",
                "required with --host-api-port (at least one audience)",
            ));
        }
        let max_ttl = self.host_token_max_ttl.map_or(DEFAULT_MAX_TTL, |d| d.std());
        // Lifetimes are whole seconds: a maximum under one would refuse every token.
        if max_ttl < Duration::from_secs(1) {
            return Err(err("--host-token-max-ttl", "must be at least 1s"));
        }
        let rate_limit = self.host_api_rate_limit.unwrap_or(DEFAULT_RATE_LIMIT);
        if rate_limit == 0 {
            return Err(err("--host-api-rate-limit", "must be greater than 0"));
        }
        let rate_window = self
            .host_api_rate_window
            .map_or(DEFAULT_RATE_WINDOW, |d| d.std());
        if rate_window.is_zero() {
            return Err(err("--host-api-rate-window", "must be greater than 0"));
        }
        Ok(Some(Settings {
            port,
            tls_cert_file,
            tls_key_file,
            public_key_der,
            issuer: issuer.to_string(),
            audience,
            max_ttl,
            rate_limit,
            rate_window,
        }))
    }

    /// The first Host API flag given, other than the port.
    fn first_given(&self) -> Option<&'static str> {
        [
            (
                self.host_api_tls_cert_file.is_some(),
                "--host-api-tls-cert-file",
            ),
            (
                self.host_api_tls_key_file.is_some(),
                "--host-api-tls-key-file",
            ),
            (
                self.host_token_public_key_file.is_some(),
                "--host-token-public-key-file",
            ),
            (self.host_token_issuer.is_some(), "--host-token-issuer"),
            (
                !self.host_token_audience.is_empty(),
                "--host-token-audience",
            ),
            (self.host_token_max_ttl.is_some(), "--host-token-max-ttl"),
            (self.host_api_rate_limit.is_some(), "--host-api-rate-limit"),
            (
                self.host_api_rate_window.is_some(),
                "--host-api-rate-window",
            ),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

/// Words that mark a value someone forgot to fill in.
const PLACEHOLDER_WORDS: [&str; 6] = [
    "changeme",
    "placeholder",
    "todo",
    "replaceme",
    "example",
    "fixme",
];

/// An issuer or audience: non-empty, no whitespace, not a placeholder (`changeme`,
/// `placeholder`, `todo`, `replace-me`, `<...>`, `example` and the example.com/.org/.net
/// hosts, an unexpanded `$(VAR)` or `${VAR}`). Words are compared whole (split on
/// punctuation), so `https://todoist.com` passes.
pub fn check_claim_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.chars().any(char::is_whitespace) {
        return Err(format!("{value:?} contains whitespace"));
    }
    // `$(VAR)` is what Kubernetes leaves of a reference to an undefined variable.
    if value.contains('<') || value.contains('>') || value.contains("$(") || value.contains("${") {
        return Err(format!("{value:?} is a placeholder"));
    }
    if has_placeholder_word(value) {
        return Err(format!("{value:?} is a placeholder"));
    }
    Ok(())
}

/// Whether `text` holds one of [`PLACEHOLDER_WORDS`] as a whole word, also with `-` and `_`
/// taken out (`replace-me`, `change_me`).
fn has_placeholder_word(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    // `replace-me`, `change_me`: the joined form is a placeholder word too.
    let joined: String = lower
        .split(['-', '_'])
        .collect::<Vec<_>>()
        .join("")
        .to_string();
    let words = lower.split(|c: char| !c.is_ascii_alphanumeric());
    let joined_words = joined.split(|c: char| !c.is_ascii_alphanumeric());
    words
        .chain(joined_words)
        .any(|w| PLACEHOLDER_WORDS.contains(&w))
}

/// Reads the host token issuer's public key: PEM `PUBLIC KEY` (SPKI, rsaEncryption) or
/// `RSA PUBLIC KEY` (PKCS#1), [`MIN_RSA_BITS`] to [`MAX_RSA_BITS`]. Returns it as PKCS#1 DER. Messages
/// name the problem, never the key.
pub fn load_public_key(path: &Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let shown = path.display();
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{shown} is not a PEM file (not UTF-8 text)"))?;
    if text.trim().is_empty() {
        return Err(format!("{shown} is empty (a placeholder)"));
    }
    if text.contains("PRIVATE KEY-----") {
        return Err(format!(
            "{shown} holds a PRIVATE key: configure the issuer's public key only (e.g. `openssl pkey -in key.pem -pubout`) and keep the private key with the issuer"
        ));
    }
    let blocks = pem_blocks(&text);
    if is_placeholder_text(&text) {
        return Err(format!("{shown} is a placeholder, not a key"));
    }
    let Some((label, der)) = blocks.into_iter().next() else {
        return Err(format!("{shown} holds no PEM block"));
    };
    let der = der.map_err(|()| format!("{shown}: the PEM block {label:?} is not valid base64"))?;
    let pkcs1 = match label.as_str() {
        "RSA PUBLIC KEY" => der,
        "PUBLIC KEY" => spki_rsa(&der)
            .ok_or_else(|| format!("{shown}: the PUBLIC KEY is not an RSA key (or malformed)"))?,
        other => {
            return Err(format!(
                "{shown} holds a {other:?} PEM block; expected PUBLIC KEY or RSA PUBLIC KEY"
            ))
        }
    };
    let bits =
        rsa_modulus_bits(&pkcs1).ok_or_else(|| format!("{shown}: malformed RSA public key"))?;
    if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) {
        return Err(format!(
            "{shown}: the RSA key has {bits} bits; {MIN_RSA_BITS} to {MAX_RSA_BITS} are accepted"
        ));
    }
    Ok(pkcs1)
}

/// Whether the file's text outside PEM base64 bodies holds a placeholder: one of
/// [`PLACEHOLDER_WORDS`] as a whole word, a bare `replace` (`REPLACE with the key`), `<` or
/// `>`. Base64 bodies are skipped: a real key's body can spell any word.
fn is_placeholder_text(text: &str) -> bool {
    let mut inside = false;
    let mut outside = String::new();
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with("-----BEGIN ") {
            inside = true;
        } else if l.starts_with("-----END ") {
            inside = false;
        } else if inside
            && l.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '/' || c == '=')
        {
            continue;
        }
        outside.push_str(l);
        outside.push('\n');
    }
    outside.contains('<')
        || outside.contains('>')
        || has_placeholder_word(&outside)
        || outside
            .to_ascii_lowercase()
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| w == "replace")
}

/// The PEM blocks of `text`: label and decoded body.
fn pem_blocks(text: &str) -> Vec<(String, Result<Vec<u8>, ()>)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        let l = line.trim();
        if let Some(label) = l
            .strip_prefix("-----BEGIN ")
            .and_then(|r| r.strip_suffix("-----"))
        {
            current = Some((label.to_string(), String::new()));
        } else if let Some(label) = l
            .strip_prefix("-----END ")
            .and_then(|r| r.strip_suffix("-----"))
        {
            if let Some((begun, body)) = current.take() {
                if begun == label {
                    let der = base64::engine::general_purpose::STANDARD
                        .decode(body.as_bytes())
                        .map_err(|_| ());
                    out.push((begun, der));
                }
            }
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(l);
        }
    }
    out
}

/// One DER element at the start of `der`: (tag, content, rest).
fn der_element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let mut len = 0usize;
        for &b in &rest[..n] {
            len = (len << 8) | usize::from(b);
        }
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The DER of OID 1.2.840.113549.1.1.1 (rsaEncryption).
const RSA_ENCRYPTION: [u8; 9] = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];

/// The PKCS#1 key inside an SPKI of algorithm rsaEncryption.
fn spki_rsa(der: &[u8]) -> Option<Vec<u8>> {
    let (0x30, spki, _) = der_element(der)? else {
        return None;
    };
    let (0x30, algorithm, rest) = der_element(spki)? else {
        return None;
    };
    let (0x06, oid, _) = der_element(algorithm)? else {
        return None;
    };
    if oid != RSA_ENCRYPTION {
        return None;
    }
    let (0x03, bits, _) = der_element(rest)? else {
        return None;
    };
    // The first byte of a BIT STRING counts unused bits: 0 for a key.
    match bits.split_first() {
        Some((0, key)) => Some(key.to_vec()),
        _ => None,
    }
}

/// The size in bits of the modulus of a PKCS#1 RSAPublicKey that ring can verify with: the
/// modulus and exponent only, positive and minimally encoded, nothing after them, an odd
/// exponent from 3 to 2^33 - 1. `None` for anything else.
fn rsa_modulus_bits(pkcs1: &[u8]) -> Option<usize> {
    let (0x30, seq, []) = der_element(pkcs1)? else {
        return None;
    };
    let (0x02, n, rest) = der_element(seq)? else {
        return None;
    };
    let (0x02, e, []) = der_element(rest)? else {
        return None;
    };
    let n = positive_integer(n)?;
    let e = positive_integer(e)?;
    // ring verifies with exponents from 3 to 2^33 - 1, odd: anything else would refuse every
    // token at request time rather than stop startup.
    let exponent = (e.len() <= 5).then(|| e.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b)))?;
    if exponent < 3 || exponent % 2 == 0 || exponent >= 1 << 33 {
        return None;
    }
    let (&top, _) = n.split_first()?;
    Some((n.len() - 1) * 8 + (8 - top.leading_zeros() as usize))
}

/// The magnitude of a DER INTEGER's content that is positive and minimally encoded.
fn positive_integer(content: &[u8]) -> Option<&[u8]> {
    match content {
        [] => None,
        [0, next, ..] if *next >= 0x80 => Some(&content[1..]),
        [first, ..] if *first == 0 || *first >= 0x80 => None,
        _ => Some(content),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::process::Command;
    use std::sync::OnceLock;

    /// Test keys made with the openssl CLI, once per test process.
    pub(crate) struct Keys {
        pub dir: PathBuf,
        pub private_pem: PathBuf,
        pub spki_pem: PathBuf,
        pub pkcs1_pem: PathBuf,
        pub small_spki_pem: PathBuf,
        pub ec_spki_pem: PathBuf,
    }

    pub(crate) fn keys() -> &'static Keys {
        static KEYS: OnceLock<Keys> = OnceLock::new();
        KEYS.get_or_init(|| {
            let dir = std::env::temp_dir().join(format!(
                "hostapi-keys-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let run = |args: &[&str]| {
                let out = Command::new("openssl")
                    .args(args)
                    .current_dir(&dir)
                    .output()
                    .expect("openssl runs");
                assert!(out.status.success(), "openssl {args:?}: {out:?}");
            };
            run(&["genrsa", "-out", "key.pem", "2048"]);
            run(&["pkey", "-in", "key.pem", "-pubout", "-out", "pub.pem"]);
            run(&[
                "rsa",
                "-in",
                "key.pem",
                "-RSAPublicKey_out",
                "-out",
                "pub1.pem",
            ]);
            run(&["genrsa", "-out", "small.pem", "1024"]);
            run(&[
                "pkey",
                "-in",
                "small.pem",
                "-pubout",
                "-out",
                "smallpub.pem",
            ]);
            run(&[
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                "ec.pem",
            ]);
            run(&["pkey", "-in", "ec.pem", "-pubout", "-out", "ecpub.pem"]);
            Keys {
                private_pem: dir.join("key.pem"),
                spki_pem: dir.join("pub.pem"),
                pkcs1_pem: dir.join("pub1.pem"),
                small_spki_pem: dir.join("smallpub.pem"),
                ec_spki_pem: dir.join("ecpub.pem"),
                dir,
            }
        })
    }

    fn write(name: &str, text: &str) -> PathBuf {
        let path = keys().dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    pub(crate) fn valid_args() -> Args {
        Args {
            host_api_port: Some(8443),
            host_api_tls_cert_file: Some("/tls.crt".into()),
            host_api_tls_key_file: Some("/tls.key".into()),
            host_token_public_key_file: Some(keys().spki_pem.clone()),
            host_token_issuer: Some("https://issuer.mcp.internal".into()),
            host_token_audience: vec!["mcp-host-api".into()],
            ..Args::default()
        }
    }

    fn failure(args: &Args) -> String {
        args.settings().unwrap_err().to_string()
    }

    #[test]
    fn both_public_key_encodings_load_and_agree() {
        let spki = load_public_key(&keys().spki_pem).unwrap();
        let pkcs1 = load_public_key(&keys().pkcs1_pem).unwrap();
        assert_eq!(spki, pkcs1);
        assert_eq!(rsa_modulus_bits(&spki), Some(2048));
        let s = valid_args().settings().unwrap().unwrap();
        assert_eq!(s.max_ttl, DEFAULT_MAX_TTL);
        assert_eq!(s.rate_limit, 120);
        assert_eq!(s.rate_window, Duration::from_secs(60));
    }

    #[test]
    fn off_without_a_port_and_any_other_flag_alone_is_an_error() {
        assert!(Args::default().settings().unwrap().is_none());
        let only_issuer = Args {
            host_token_issuer: Some("https://issuer.mcp.internal".into()),
            ..Args::default()
        };
        assert!(
            failure(&only_issuer).starts_with("--host-token-issuer: given without --host-api-port")
        );
        let only_window = Args {
            host_api_rate_window: Some("1m".parse().unwrap()),
            ..Args::default()
        };
        assert!(failure(&only_window).starts_with("--host-api-rate-window"));
    }

    #[test]
    fn each_bad_public_key_names_the_flag_and_never_the_key() {
        let private = std::fs::read_to_string(&keys().private_pem).unwrap();
        let cases: Vec<(PathBuf, &str)> = vec![
            (keys().dir.join("absent.pem"), "cannot read"),
            (write("empty.pem", "  \n\t"), "empty"),
            (
                write("placeholder.pem", "REPLACE_WITH_THE_ISSUER_PUBLIC_KEY\n"),
                "placeholder",
            ),
            (
                write(
                    "todo.pem",
                    "-----BEGIN PUBLIC KEY-----\nTODO\n-----END PUBLIC KEY-----\n# todo: paste\n",
                ),
                "placeholder",
            ),
            (write("garbage.pem", "not a key at all"), "no PEM block"),
            (
                write(
                    "badb64.pem",
                    "-----BEGIN PUBLIC KEY-----\n!!!!\n-----END PUBLIC KEY-----\n",
                ),
                "not valid base64",
            ),
            (
                write(
                    "truncated.pem",
                    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n-----END PUBLIC KEY-----\n",
                ),
                "not an RSA key",
            ),
            (keys().private_pem.clone(), "PRIVATE key"),
            (write("private-in-bundle.pem", &format!("{}\n{private}", std::fs::read_to_string(&keys().spki_pem).unwrap())), "PRIVATE key"),
            (keys().small_spki_pem.clone(), "1024 bits"),
            (keys().ec_spki_pem.clone(), "not an RSA key"),
        ];
        for (path, needle) in cases {
            let args = Args {
                host_token_public_key_file: Some(path.clone()),
                ..valid_args()
            };
            let message = failure(&args);
            assert!(
                message.starts_with("--host-token-public-key-file: ") && message.contains(needle),
                "{}: {message}",
                path.display()
            );
            assert!(!message.contains("MII"), "key material in {message}");
        }
    }

    #[test]
    fn issuer_and_audience_placeholders_fail() {
        for bad in [
            "",
            "changeme",
            "https://issuer.example.com",
            "https://example.org/issuer",
            "<issuer>",
            "replace-me",
            "REPLACE_ME",
            "todo",
            "placeholder",
            "https://host issuer",
            "$(HOST_TOKEN_ISSUER)",
            "https://${ISSUER_HOST}/",
        ] {
            let issuer = Args {
                host_token_issuer: Some(bad.into()),
                ..valid_args()
            };
            assert!(
                failure(&issuer).starts_with("--host-token-issuer: "),
                "issuer {bad:?}"
            );
            let audience = Args {
                host_token_audience: vec!["mcp-host-api".into(), bad.into()],
                ..valid_args()
            };
            assert!(
                failure(&audience).starts_with("--host-token-audience: "),
                "audience {bad:?}"
            );
        }
        for good in [
            "https://todoist.com/issuer",
            "mcp-host-api",
            "https://issuer.mcp.internal",
        ] {
            check_claim_value(good).unwrap();
        }
        let missing_issuer = Args {
            host_token_issuer: None,
            ..valid_args()
        };
        assert!(failure(&missing_issuer).starts_with("--host-token-issuer: required"));
        let missing_audience = Args {
            host_token_audience: vec![],
            ..valid_args()
        };
        assert!(failure(&missing_audience).starts_with("--host-token-audience: required"));
        let missing_cert = Args {
            host_api_tls_cert_file: None,
            ..valid_args()
        };
        assert!(failure(&missing_cert).starts_with("--host-api-tls-cert-file: required"));
    }

    /// A PKCS#1 RSAPublicKey of a modulus of `bits` bits and `exponent`, then `trailing`.
    fn pkcs1(bits: usize, exponent: &[u8], trailing: &[u8]) -> Vec<u8> {
        fn element(tag: u8, content: &[u8]) -> Vec<u8> {
            let mut out = vec![tag];
            match content.len() {
                n if n < 0x80 => out.push(n as u8),
                n if n < 0x100 => out.extend([0x81, n as u8]),
                n => out.extend([0x82, (n >> 8) as u8, n as u8]),
            }
            out.extend_from_slice(content);
            out
        }
        // A leading zero keeps the top bit (set) from making the modulus negative.
        let mut n = vec![0u8, 0x80];
        n.extend(std::iter::repeat_n(0x5a, bits / 8 - 1));
        let mut body = element(0x02, &n);
        body.extend(element(0x02, exponent));
        let mut out = element(0x30, &body);
        out.extend_from_slice(trailing);
        out
    }

    #[test]
    fn rsa_keys_ring_cannot_verify_with_are_refused() {
        assert_eq!(rsa_modulus_bits(&pkcs1(2048, &[1, 0, 1], &[])), Some(2048));
        assert_eq!(rsa_modulus_bits(&pkcs1(4096, &[3], &[])), Some(4096));
        for (what, der) in [
            ("bytes after the key", pkcs1(2048, &[1, 0, 1], &[0])),
            ("an even exponent", pkcs1(2048, &[1, 0, 0], &[])),
            ("an exponent of 1", pkcs1(2048, &[1], &[])),
            (
                "an exponent of 2^33 + 1",
                pkcs1(2048, &[2, 0, 0, 0, 1], &[]),
            ),
            ("a negative exponent", pkcs1(2048, &[0x81], &[])),
            ("a non-minimal exponent", pkcs1(2048, &[0, 1, 0, 1], &[])),
        ] {
            assert_eq!(rsa_modulus_bits(&der), None, "{what}");
        }
        // Well formed but over ring's 8192 bits: refused by size, at startup.
        let big = write(
            "big.pem",
            &format!(
                "-----BEGIN RSA PUBLIC KEY-----\n{}\n-----END RSA PUBLIC KEY-----\n",
                base64::engine::general_purpose::STANDARD.encode(pkcs1(8200, &[1, 0, 1], &[]))
            ),
        );
        let message = load_public_key(&big).unwrap_err();
        assert!(message.contains("8200 bits; 2048 to 8192"), "{message}");
    }

    #[test]
    fn zero_ttl_limit_and_window_fail() {
        for (args, flag) in [
            (
                Args {
                    host_token_max_ttl: Some("0s".parse().unwrap()),
                    ..valid_args()
                },
                "--host-token-max-ttl",
            ),
            (
                Args {
                    host_token_max_ttl: Some("500ms".parse().unwrap()),
                    ..valid_args()
                },
                "--host-token-max-ttl: must be at least 1s",
            ),
            (
                Args {
                    host_api_rate_limit: Some(0),
                    ..valid_args()
                },
                "--host-api-rate-limit",
            ),
            (
                Args {
                    host_api_rate_window: Some("0s".parse().unwrap()),
                    ..valid_args()
                },
                "--host-api-rate-window",
            ),
        ] {
            assert!(failure(&args).starts_with(flag), "{flag}");
        }
    }
}
