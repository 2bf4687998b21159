//! Errors as kubectl prints them: a `Status` from the server is
//! `Error from server (Reason): message`, anything else is `error: message`; both exit 1.

use std::fmt;

use kube::core::Status;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The server refused the request with a `Status`.
    #[error("{}", server_message(.0))]
    Server(Box<Status>),
    /// The request did not get a `Status` back (connection, TLS, decoding).
    #[error("error: {0}")]
    Client(kube::Error),
    /// The kubeconfig could not be loaded.
    #[error("error: {0}")]
    Config(String),
    /// Anything the plugin itself refuses or cannot do.
    #[error("error: {0}")]
    Other(String),
}

/// kubectl's rendering of a server error (`k8s.io/kubectl/pkg/cmd/util.StandardErrorMessage`).
fn server_message(status: &Status) -> String {
    let message = if status.message.is_empty() {
        "unknown".to_string()
    } else {
        status.message.clone()
    };
    if status.reason.is_empty() {
        format!("Error from server: {message}")
    } else {
        format!("Error from server ({}): {message}", status.reason)
    }
}

impl From<kube::Error> for CliError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(status) => Self::Server(status),
            other => Self::Client(other),
        }
    }
}

impl CliError {
    /// A plugin-side failure with a message.
    pub fn other(message: impl fmt::Display) -> Self {
        Self::Other(message.to_string())
    }

    /// The HTTP code of a server error.
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Server(status) => Some(status.code),
            _ => None,
        }
    }
}

pub type Result<T, E = CliError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn status(reason: &str, message: &str, code: u16) -> Box<Status> {
        Box::new(Status {
            reason: reason.into(),
            message: message.into(),
            code,
            ..Status::default()
        })
    }

    #[test]
    fn forbidden_prints_as_kubectl_does() {
        let e = CliError::from(kube::Error::Api(status(
            "Forbidden",
            "revocations.access.mcp-runtime.dev is forbidden: User \"bob\" cannot create resource \"revocations\"",
            403,
        )));
        assert_eq!(
            e.to_string(),
            "Error from server (Forbidden): revocations.access.mcp-runtime.dev is forbidden: User \"bob\" cannot create resource \"revocations\""
        );
        assert_eq!(e.code(), Some(403));
    }

    #[test]
    fn a_status_without_reason_has_no_parentheses() {
        let e = CliError::from(kube::Error::Api(status("", "boom", 500)));
        assert_eq!(e.to_string(), "Error from server: boom");
    }

    #[test]
    fn plugin_errors_start_with_error() {
        assert_eq!(
            CliError::other("no such thing").to_string(),
            "error: no such thing"
        );
    }
}
