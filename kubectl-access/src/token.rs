//! `token NAME`: a session token from the AccessSession's `token` subresource
//! (docs/session-tokens.md), printed alone on a line as `kubectl create token` prints a
//! ServiceAccount's, so `$(kubectl access token ...)` is the token.

use apis::session_token::TOKEN_SUBRESOURCE;
use apis::types::AccessSession;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use kube::api::{Api, PostParams};

use crate::cli::TokenArgs;
use crate::client::Context;
use crate::error::{CliError, Result};

/// The `TokenRequest` to post: `--duration` as `spec.expirationSeconds` (none for 0, as
/// kubectl, so the server's default applies), `--audience` as `spec.audiences` (none without
/// it, so the server's resource URI applies).
pub fn token_request(args: &TokenArgs) -> Result<TokenRequest> {
    let expiration_seconds = match args.duration.filter(|d| !d.is_zero()) {
        Some(d) => Some(
            i64::try_from(d.std().as_secs())
                .map_err(|_| CliError::other("--duration is too long"))?,
        ),
        None => None,
    };
    Ok(TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: (!args.audiences.is_empty()).then(|| args.audiences.clone()),
            expiration_seconds,
            bound_object_ref: None,
        }),
        ..TokenRequest::default()
    })
}

/// What is printed: the token and a newline. A response without one is an error rather
/// than an empty line a script would take for a token.
pub fn printed(response: &TokenRequest) -> Result<String> {
    match response.status.as_ref().and_then(|s| s.token.as_deref()) {
        Some(token) if !token.is_empty() => Ok(format!("{token}\n")),
        _ => Err(CliError::other(
            "failed to create token: no token in server response",
        )),
    }
}

pub async fn token(ctx: &Context, args: &TokenArgs) -> Result<String> {
    let request = token_request(args)?;
    let api: Api<AccessSession> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let response: TokenRequest = api
        .create_subresource(
            TOKEN_SUBRESOURCE,
            &args.session,
            &PostParams::default(),
            &request,
        )
        .await?;
    printed(&response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::duration::GoDuration;
    use k8s_openapi::api::authentication::v1::TokenRequestStatus;
    use serde_json::json;

    fn mk_args(duration: Option<&str>, audiences: &[&str]) -> TokenArgs {
        TokenArgs {
            session: "bot-github".into(),
            duration: duration.map(|d| d.parse::<GoDuration>().unwrap()),
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
        }
    }

    fn body(args: &TokenArgs) -> serde_json::Value {
        serde_json::to_value(token_request(args).unwrap()).unwrap()
    }

    #[test]
    fn the_body_is_an_authentication_v1_token_request() {
        assert_eq!(
            body(&mk_args(Some("10m"), &["https://a.example"])),
            json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "metadata": {},
                "spec": {"audiences": ["https://a.example"], "expirationSeconds": 600},
            })
        );
    }

    #[test]
    fn without_flags_the_server_decides_lifetime_and_audience() {
        assert_eq!(body(&mk_args(None, &[]))["spec"], json!({}));
        assert_eq!(body(&mk_args(Some("0"), &[]))["spec"], json!({}));
        assert_eq!(
            body(&mk_args(Some("1h30m"), &[]))["spec"],
            json!({"expirationSeconds": 5400})
        );
    }

    fn answered(token: Option<&str>) -> TokenRequest {
        TokenRequest {
            status: Some(TokenRequestStatus {
                token: token.map(Into::into),
                expiration_timestamp: None,
            }),
            ..TokenRequest::default()
        }
    }

    #[test]
    fn only_the_token_is_printed() {
        assert_eq!(printed(&answered(Some("a.b.c"))).unwrap(), "a.b.c\n");
    }

    #[test]
    fn a_response_without_a_token_is_an_error() {
        for response in [answered(None), answered(Some("")), TokenRequest::default()] {
            assert_eq!(
                printed(&response).unwrap_err().to_string(),
                "error: failed to create token: no token in server response"
            );
        }
    }
}
