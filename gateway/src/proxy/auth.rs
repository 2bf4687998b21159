//! Bearer extraction: exactly one `Authorization` header, scheme `Bearer` (any case), and
//! never a token from the query string (RFC 6750 §2.3 is not supported: a URL is logged and
//! forwarded, a header is not).

use http::HeaderMap;

/// Why no token could be taken from a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BearerError {
    /// No `Authorization` header: `token_missing`.
    Missing,
    /// Two headers, another scheme, an empty or malformed token, or an `access_token` query
    /// parameter: `token_invalid`.
    Malformed,
}

/// The token of the request's one `Authorization: Bearer` header.
pub fn bearer<'a>(headers: &'a HeaderMap, query: Option<&str>) -> Result<&'a str, BearerError> {
    if query.is_some_and(has_access_token_param) {
        return Err(BearerError::Malformed);
    }
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => return Err(BearerError::Missing),
        (Some(_), Some(_)) => return Err(BearerError::Malformed),
        (Some(v), None) => v,
    };
    let text = value.to_str().map_err(|_| BearerError::Malformed)?;
    let (scheme, token) = text.split_once(' ').ok_or(BearerError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(BearerError::Malformed);
    }
    let token = token.trim_matches(' ');
    // RFC 6750 b64token: no spaces inside, at least one character.
    let b64token = |c: u8| c.is_ascii_alphanumeric() || b"-._~+/=".contains(&c);
    if token.is_empty() || !token.bytes().all(b64token) {
        return Err(BearerError::Malformed);
    }
    Ok(token)
}

/// Whether a query string names `access_token` (however encoded in case).
fn has_access_token_param(query: &str) -> bool {
    query.split('&').any(|pair| {
        let name = pair.split('=').next().unwrap_or("");
        name.eq_ignore_ascii_case("access_token") || name.eq_ignore_ascii_case("access%5Ftoken")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn h(values: &[&str]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for v in values {
            m.append(
                http::header::AUTHORIZATION,
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn one_bearer_header() {
        assert_eq!(bearer(&h(&["Bearer abc.def.ghi"]), None), Ok("abc.def.ghi"));
        assert_eq!(bearer(&h(&["bearer abc"]), None), Ok("abc"));
        assert_eq!(bearer(&h(&["BEARER  abc "]), None), Ok("abc"));
        assert_eq!(bearer(&h(&[]), None), Err(BearerError::Missing));
        for bad in [
            &["Bearer a", "Bearer a"][..],
            &["Basic YTpi"],
            &["Bearer"],
            &["Bearer "],
            &["Bearer a b"],
            &["Bearerabc"],
            &["Bearer a\"b"],
        ] {
            assert_eq!(
                bearer(&h(bad), None),
                Err(BearerError::Malformed),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn never_from_the_query() {
        assert_eq!(
            bearer(&h(&[]), Some("access_token=abc")),
            Err(BearerError::Malformed)
        );
        assert_eq!(
            bearer(&h(&["Bearer a"]), Some("x=1&Access_Token=abc")),
            Err(BearerError::Malformed)
        );
        assert_eq!(bearer(&h(&["Bearer a"]), Some("x=access_token")), Ok("a"));
    }
}
