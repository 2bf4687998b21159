//! The session-token keys: an EC P-256 PKCS#8 signing key and public verification keys, read
//! from PEM files and refused (naming the flag, never echoing key bytes) when they are
//! anything else.

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING};
use rustls_pki_types::pem::{PemObject, SectionKind};
use serde_json::{json, Value};

/// The flag naming the signing key file.
pub const SIGNING_KEY_FLAG: &str = "--session-token-signing-key-file";
/// The flag naming a verification key file.
pub const VERIFICATION_KEY_FLAG: &str = "--session-token-verification-key-file";

/// The DER prefix of a P-256 `SubjectPublicKeyInfo` (id-ecPublicKey, prime256v1), before
/// the 65-byte uncompressed point.
const P256_SPKI_PREFIX: &[u8] = &[
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// Why a key file is refused. The text names the flag and the file, never key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{flag} {path}: cannot read the file: {source}")]
    Unreadable {
        flag: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{flag} {path}: the file is readable by others, or by a group this process is not in (mode {mode:04o}); it holds a private key: chmod 600 it")]
    Permissions {
        flag: &'static str,
        path: String,
        mode: u32,
    },
    #[error("{flag} {path}: {what}")]
    Malformed {
        flag: &'static str,
        path: String,
        what: &'static str,
    },
}

/// A public key as published in the JWKS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    /// The uncompressed point, `04 || x || y`.
    point: Vec<u8>,
    /// RFC 7638 thumbprint (SHA-256, base64url without padding).
    pub kid: String,
}

impl PublicKey {
    fn from_point(point: &[u8]) -> Option<Self> {
        if point.len() != 65 || point[0] != 0x04 {
            return None;
        }
        let (x, y) = (
            URL_SAFE_NO_PAD.encode(&point[1..33]),
            URL_SAFE_NO_PAD.encode(&point[33..]),
        );
        // RFC 7638 §3.2: the required members, in lexicographic order, no whitespace.
        let canonical = format!(r#"{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}"#);
        let digest = ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes());
        Some(Self {
            point: point.to_vec(),
            kid: URL_SAFE_NO_PAD.encode(digest.as_ref()),
        })
    }

    /// The key as a JWK.
    pub fn jwk(&self) -> Value {
        json!({
            "kty": "EC",
            "crv": "P-256",
            "x": URL_SAFE_NO_PAD.encode(&self.point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&self.point[33..]),
            "kid": self.kid,
            "alg": apis::session_token::ALGORITHM,
            "use": "sig",
        })
    }
}

/// The signing key: a P-256 key pair and its public half.
pub struct SigningKey {
    pair: EcdsaKeyPair,
    rng: SystemRandom,
    pub public: PublicKey,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.public.kid)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Reads the signing key file: mode 600 (or stricter), PEM `PRIVATE KEY` (PKCS#8) of an
    /// EC P-256 key.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let flag = SIGNING_KEY_FLAG;
        check_private_mode(flag, path)?;
        let pem = read(flag, path)?;
        let malformed = |what| KeyError::Malformed {
            flag,
            path: path.display().to_string(),
            what,
        };
        let mut pkcs8 = None;
        for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(&pem) {
            let (kind, der) = section.map_err(|_| malformed("the file is not valid PEM"))?;
            match kind {
                SectionKind::PrivateKey if pkcs8.is_none() => pkcs8 = Some(der),
                SectionKind::PrivateKey => {
                    return Err(malformed("the file holds more than one private key"))
                }
                SectionKind::EcPrivateKey => return Err(malformed(
                    "the key is a SEC 1 \"EC PRIVATE KEY\", not PKCS#8: convert it with `openssl pkcs8 -topk8 -nocrypt`",
                )),
                SectionKind::RsaPrivateKey => {
                    return Err(malformed("the key is an RSA key, not EC P-256 (ES256)"))
                }
                _ => {}
            }
        }
        let der = pkcs8
            .ok_or_else(|| malformed("no unencrypted PEM \"PRIVATE KEY\" (PKCS#8) in the file"))?;
        let rng = SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &rng)
            .map_err(|_| malformed("the key is not an EC P-256 PKCS#8 private key (ES256)"))?;
        let public = PublicKey::from_point(pair.public_key().as_ref()).ok_or_else(|| {
            malformed("the key's public point is not an uncompressed P-256 point")
        })?;
        Ok(Self { pair, rng, public })
    }

    /// A generated key (tests, and nothing else: production keys come from files).
    pub fn generate() -> Result<Self, ring::error::Unspecified> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)?;
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .map_err(|_| ring::error::Unspecified)?;
        let public =
            PublicKey::from_point(pair.public_key().as_ref()).ok_or(ring::error::Unspecified)?;
        Ok(Self { pair, rng, public })
    }

    /// The ES256 signature (`r || s`) of `message`.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, ring::error::Unspecified> {
        Ok(self.pair.sign(&self.rng, message)?.as_ref().to_vec())
    }
}

/// Reads a verification key file: PEM `PUBLIC KEY` of an EC P-256 key, and no private key.
pub fn load_public(path: &Path) -> Result<PublicKey, KeyError> {
    let flag = VERIFICATION_KEY_FLAG;
    let pem = read(flag, path)?;
    let malformed = |what| KeyError::Malformed {
        flag,
        path: path.display().to_string(),
        what,
    };
    let mut spki = None;
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(&pem) {
        let (kind, der) = section.map_err(|_| malformed("the file is not valid PEM"))?;
        match kind {
            SectionKind::PrivateKey
            | SectionKind::EcPrivateKey
            | SectionKind::RsaPrivateKey => {
                return Err(malformed(
                    "the file holds a private key; a verification key file holds only the public half (`openssl pkey -pubout`)",
                ))
            }
            SectionKind::PublicKey if spki.is_none() => spki = Some(der),
            SectionKind::PublicKey => {
                return Err(malformed("the file holds more than one public key"))
            }
            _ => {}
        }
    }
    // An unrecognised private-key block (e.g. encrypted) is refused as well.
    if String::from_utf8_lossy(&pem).contains("PRIVATE KEY-----") {
        return Err(malformed(
            "the file holds a private key; a verification key file holds only the public half (`openssl pkey -pubout`)",
        ));
    }
    let der = spki.ok_or_else(|| malformed("no PEM \"PUBLIC KEY\" in the file"))?;
    let point = der
        .strip_prefix(P256_SPKI_PREFIX)
        .ok_or_else(|| malformed("the key is not an EC P-256 public key (ES256)"))?;
    PublicKey::from_point(point)
        .ok_or_else(|| malformed("the key is not an uncompressed EC P-256 public key"))
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, KeyError> {
    std::fs::read(path).map_err(|source| KeyError::Unreadable {
        flag,
        path: path.display().to_string(),
        source,
    })
}

/// A private key file must not be readable by others, nor by its group unless that group is
/// one of this process's own (a Kubernetes Secret volume: `fsGroup`, mode 0440, the only
/// way a non-root container reads a mounted Secret).
fn check_private_mode(flag: &'static str, path: &Path) -> Result<(), KeyError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        let meta = std::fs::metadata(path).map_err(|source| KeyError::Unreadable {
            flag,
            path: path.display().to_string(),
            source,
        })?;
        let mode = meta.permissions().mode();
        let group_ok = mode & 0o070 == 0 || (meta.gid() != 0 && own_groups().contains(&meta.gid()));
        if mode & 0o007 != 0 || !group_ok {
            return Err(KeyError::Permissions {
                flag,
                path: path.display().to_string(),
                mode: mode & 0o7777,
            });
        }
    }
    Ok(())
}

/// The process's group ids (effective and supplementary), from `/proc/self/status`; none
/// when that cannot be read (fail closed: a group-readable key is then refused).
#[cfg(unix)]
fn own_groups() -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return Vec::new();
    };
    let mut groups = Vec::new();
    for line in status.lines() {
        if let Some(ids) = line.strip_prefix("Gid:") {
            // real, effective, saved, filesystem: the effective one decides.
            groups.extend(
                ids.split_whitespace()
                    .nth(1)
                    .and_then(|g| g.parse::<u32>().ok()),
            );
        } else if let Some(ids) = line.strip_prefix("Groups:") {
            groups.extend(ids.split_whitespace().filter_map(|g| g.parse::<u32>().ok()));
        }
    }
    groups
}

/// The key files of one configuration, read.
#[derive(Debug)]
pub struct KeySet {
    pub signing: SigningKey,
    /// The signing key's public half first, then each verification key not already listed.
    pub published: Vec<PublicKey>,
}

impl KeySet {
    /// Reads the signing key and the verification keys.
    pub fn load(signing: &Path, verification: &[PathBuf]) -> Result<Self, KeyError> {
        let signing = SigningKey::load(signing)?;
        let mut published = vec![signing.public.clone()];
        for path in verification {
            let key = load_public(path)?;
            if !published.iter().any(|k| k.kid == key.kid) {
                published.push(key);
            }
        }
        Ok(Self { signing, published })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbprints_follow_rfc_7638() {
        // RFC 7638 has no EC example; this is the RFC 7517 appendix A.1 EC key, whose
        // thumbprint is well known.
        let x = URL_SAFE_NO_PAD
            .decode("MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4")
            .expect("x");
        let y = URL_SAFE_NO_PAD
            .decode("4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM")
            .expect("y");
        let mut point = vec![0x04];
        point.extend(x);
        point.extend(y);
        let key = PublicKey::from_point(&point).expect("a point");
        assert_eq!(key.kid, "cn-I_WNMClehiVp51i_0VpOENW1upEerA8sEam5hn-s");
        assert_eq!(key.jwk()["kid"], key.kid);
        assert_eq!(key.jwk()["alg"], "ES256");
    }

    #[test]
    fn generated_keys_sign() {
        let key = SigningKey::generate().expect("a key");
        assert_eq!(key.sign(b"m").expect("signs").len(), 64);
    }
}
