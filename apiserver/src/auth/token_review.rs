//! Bearer-token authentication through kube-apiserver's TokenReview.
//!
//! Results are cached briefly under the token's SHA-256, successes and failures apart; a
//! review that cannot be made is `Unavailable` (503), never cached (DESIGN §4).

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};

use super::cache::{AuthCacheMetrics, TtlCache};
use super::{sha256, AuthenticationError, Digest, UserInfo, AUTHENTICATED_GROUP, REVIEW_TIMEOUT};

/// How long TokenReview results are reused (kube's default for delegated servers).
const TOKEN_CACHE_TTL: Duration = Duration::from_secs(10);

/// Entries of each token cache: bounds memory whatever tokens clients send.
const TOKEN_CACHE_CAPACITY: usize = 10_000;

/// Asks kube-apiserver who a bearer token belongs to.
pub struct TokenReviewer {
    token_reviews: Api<TokenReview>,
    /// Tokens TokenReview accepted, by SHA-256 of the token.
    authenticated: TtlCache<Digest, UserInfo>,
    /// Tokens TokenReview rejected, by SHA-256 of the token. Kept apart from `authenticated`
    /// so a flood of random tokens only ever pushes out other rejections.
    rejected: TtlCache<Digest, ()>,
}

impl TokenReviewer {
    pub fn new(client: kube::Client) -> Self {
        Self {
            token_reviews: Api::all(client),
            authenticated: TtlCache::new(TOKEN_CACHE_TTL, TOKEN_CACHE_CAPACITY),
            rejected: TtlCache::new(TOKEN_CACHE_TTL, TOKEN_CACHE_CAPACITY),
        }
    }

    /// Counts cache hits and misses in `metrics` (`token_authenticated`, `token_rejected`).
    pub fn with_cache_metrics(mut self, metrics: &AuthCacheMetrics) -> Self {
        self.authenticated = self.authenticated.counted(metrics, "token_authenticated");
        self.rejected = self.rejected.counted(metrics, "token_rejected");
        self
    }

    /// The token's user, `Ok(None)` when TokenReview does not authenticate it.
    pub async fn review(&self, token: &str) -> Result<Option<UserInfo>, AuthenticationError> {
        let key = sha256(token.as_bytes());
        if let Some(user) = self.authenticated.get(&key) {
            return Ok(Some(user));
        }
        if self.rejected.get(&key).is_some() {
            return Ok(None);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        // Errors and timeouts are not cached: the next request asks again.
        let result = tokio::time::timeout(
            REVIEW_TIMEOUT,
            self.token_reviews.create(&PostParams::default(), &review),
        )
        .await
        .map_err(|_| AuthenticationError::Unavailable("TokenReview timed out".into()))?
        .map_err(|e| AuthenticationError::Unavailable(format!("TokenReview failed: {e}")))?;
        let status = result.status.unwrap_or_default();
        // A gateway's token is for the sync listener only. kube-apiserver already refuses
        // it for its own audiences; this holds even where it is configured to accept it.
        let gateway_only = status
            .audiences
            .as_ref()
            .is_some_and(|a| !a.is_empty() && a.iter().all(|a| a == super::GATEWAY_AUDIENCE));
        let user = if status.authenticated == Some(true) && !gateway_only {
            status.user.map(|u| {
                let mut groups = u.groups.unwrap_or_default();
                if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
                    groups.push(AUTHENTICATED_GROUP.to_string());
                }
                UserInfo {
                    name: u.username.unwrap_or_default(),
                    uid: u.uid.unwrap_or_default(),
                    groups,
                    extra: u.extra.unwrap_or_default(),
                }
            })
        } else {
            None
        };
        match &user {
            Some(user) => self.authenticated.insert(key, user.clone()),
            None => self.rejected.insert(key, ()),
        }
        Ok(user)
    }
}
