//! Static token file authentication, in kube-apiserver's `--token-auth-file` format:
//! `token,user,uid,"group1,group2"` per line.

use std::collections::HashMap;
use std::path::Path;

use async_trait::async_trait;

use super::{
    bearer_token, AuthenticationError, Authenticator, ConnectionInfo, UserInfo, AUTHENTICATED_GROUP,
};

/// Tokens loaded from a file.
pub struct TokenFile {
    users: HashMap<String, UserInfo>,
}

/// A token file that cannot be used. Startup fails on it.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read token file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("token file {path}, line {line}: {message}")]
    Line {
        path: String,
        line: usize,
        message: String,
    },
    #[error("token file {0} holds no tokens")]
    Empty(String),
    #[error("token file {path} is readable by group or others (mode {mode:04o}): it holds credentials; chmod 600 it")]
    Permissions { path: String, mode: u32 },
}

/// Splits one CSV line, honouring double quotes.
fn csv_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', false) if field.is_empty() => quoted = true,
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            ('"', true) => quoted = false,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    if quoted {
        return Err("unterminated quote".into());
    }
    fields.push(field);
    Ok(fields)
}

impl TokenFile {
    /// Loads and validates the file: every line needs a token, a user and a uid.
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display().to_string();
        let read_err = |source| TokenFileError::Read {
            path: shown.clone(),
            source,
        };
        // Every token in the file is a credential: refuse a file others can read.
        let mode = std::fs::metadata(path)
            .map_err(read_err)?
            .permissions()
            .mode()
            & 0o7777;
        if mode & 0o077 != 0 {
            return Err(TokenFileError::Permissions {
                path: shown.clone(),
                mode,
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        Self::parse(&text, &shown)
    }

    pub fn parse(text: &str, path: &str) -> Result<Self, TokenFileError> {
        let mut users = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let bad = |message: &str| TokenFileError::Line {
                path: path.to_string(),
                line: line_no,
                message: message.to_string(),
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields = csv_fields(line).map_err(|m| bad(&m))?;
            if fields.len() < 3 {
                return Err(bad("expected token,user,uid[,\"group1,group2\"]"));
            }
            let (token, name, uid) = (fields[0].trim(), fields[1].trim(), fields[2].trim());
            if token.is_empty() || name.is_empty() || uid.is_empty() {
                return Err(bad("token, user and uid must not be empty"));
            }
            let mut groups: Vec<String> = fields
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
                groups.push(AUTHENTICATED_GROUP.to_string());
            }
            if users
                .insert(
                    token.to_string(),
                    UserInfo {
                        name: name.to_string(),
                        uid: uid.to_string(),
                        groups,
                        extra: Default::default(),
                    },
                )
                .is_some()
            {
                return Err(bad("duplicate token"));
            }
        }
        if users.is_empty() {
            return Err(TokenFileError::Empty(path.to_string()));
        }
        Ok(Self { users })
    }
}

#[async_trait]
impl Authenticator for TokenFile {
    async fn authenticate(
        &self,
        request: &http::request::Parts,
        _connection: &ConnectionInfo,
    ) -> Result<Option<UserInfo>, AuthenticationError> {
        match bearer_token(request) {
            None => Ok(None),
            Some(token) => self
                .users
                .get(token)
                .cloned()
                .map(Some)
                .ok_or(AuthenticationError::InvalidToken),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kube_apiserver_format() {
        let f = TokenFile::parse(
            "# comment\nabc,admin,u1,\"system:masters,devs\"\ndef,bob,u2\n",
            "t",
        )
        .unwrap();
        let admin = &f.users["abc"];
        assert_eq!(admin.name, "admin");
        assert_eq!(
            admin.groups,
            ["system:masters", "devs", "system:authenticated"]
        );
        assert_eq!(f.users["def"].groups, ["system:authenticated"]);
        assert!(TokenFile::parse("", "t").is_err());
        assert!(TokenFile::parse("abc,admin", "t").is_err());
        assert!(TokenFile::parse("abc,admin,u1,\"g", "t").is_err());
        assert!(TokenFile::parse("abc,a,u\nabc,b,u", "t").is_err());
    }
}
