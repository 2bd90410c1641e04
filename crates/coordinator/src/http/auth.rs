//! Who may use the HTTP API (docs/deploy.md §Security). When the server does not listen on
//! loopback, every route — the dashboard page, `GET /api/*`, `/metrics`, the POST routes —
//! requires the job token; on loopback none does, but a given token is still checked. A request
//! presents it as the header `Authorization: Bearer <token>` (curl, Prometheus'
//! `authorization.credentials_file`, the dashboard's own API calls). The dashboard page alone
//! also takes it as a query, `/?token=<token>`, since a browser cannot add a header to the
//! address it opens; the page keeps it for the tab (`sessionStorage`), removes it from the
//! address bar and sends it as the header with every call. The token is never logged.

use tiny_http::Request;

use super::api::ApiError;
use koala_types::handshake::Token;

/// The routes that serve the dashboard page (the only ones that take `?token=`).
pub const PAGE_ROUTES: [&str; 2] = ["/", "/index.html"];

/// The admission rule of the HTTP listener.
pub struct ApiAuth {
    /// Whether a request without the token is refused (the server is not on loopback).
    required: bool,
    /// The job token.
    token: Option<Token>,
}

impl ApiAuth {
    /// The rule of a server listening on a loopback address (`loopback`) or not, for `token`.
    /// Errors, naming the fix, when the token is required and there is none.
    pub fn new(loopback: bool, token: Option<Token>) -> Result<Self, String> {
        if !loopback && token.is_none() {
            return Err("not loopback, so every route of the API, the dashboard and /metrics needs a \
                        job token: set KOALA_TOKEN or [coordinator] token_file"
                .into());
        }
        Ok(Self { required: !loopback, token })
    }

    /// Checks a request for `path` with query string `query` (without the `?`).
    pub fn check(&self, request: &Request, path: &str, query: &str) -> Result<(), ApiError> {
        let header = request
            .headers()
            .iter()
            .find(|h| h.field.equiv("Authorization"))
            .map(|h| h.value.as_str().to_string());
        self.decide(header.as_deref(), path, query)
    }

    /// [`ApiAuth::check`] on the `Authorization` header's value, if any (a pure function of the
    /// request's text, which the fuzz targets call without a server).
    pub fn decide(&self, header: Option<&str>, path: &str, query: &str) -> Result<(), ApiError> {
        let presented = match header {
            Some(value) => {
                Some(value.trim().strip_prefix("Bearer ").unwrap_or("").trim().as_bytes().to_vec())
            }
            None if PAGE_ROUTES.contains(&path) => query_token(query),
            None => None,
        };
        match (presented, &self.token) {
            (Some(given), Some(token)) if token.matches(&given) => Ok(()),
            (Some(_), _) => Err(ApiError { status: 403, message: "wrong job token".into() }),
            (None, _) if !self.required => Ok(()),
            (None, _) if PAGE_ROUTES.contains(&path) => Err(ApiError {
                status: 401,
                message: "this dashboard is not on loopback: open it with the job token, \
                          /?token=<token> (KOALA_TOKEN)"
                    .into(),
            }),
            (None, _) => Err(ApiError {
                status: 401,
                message: "this API is not on loopback: every request needs the job token, \
                          header `Authorization: Bearer <token>` (KOALA_TOKEN)"
                    .into(),
            }),
        }
    }
}

/// The `token` parameter of a query string, percent-decoded (`None` if absent or empty).
fn query_token(query: &str) -> Option<Vec<u8>> {
    let value = query.split('&').find_map(|pair| pair.strip_prefix("token="))?;
    let decoded = percent_decode(value);
    (!decoded.is_empty()).then_some(decoded)
}

/// `%XX` escapes and `+` (a space in a form query) decoded; a malformed escape stays as it is.
fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (b'+', ..) => {
                out.push(b' ');
                i += 1;
            }
            (b, ..) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token::parse("0123456789abcdef-http", "test").expect("token")
    }

    #[test]
    fn off_loopback_every_route_needs_the_token_in_the_header() {
        let auth = ApiAuth::new(false, Some(token())).expect("a token is given");
        for path in ["/api/job", "/api/metrics", "/api/reconfigurations", "/metrics", "/api/rescale", "/x"] {
            assert_eq!(auth.decide(None, path, "").map_err(|e| e.status), Err(401), "{path}");
            let wrong = auth.decide(Some("Bearer 0123456789abcdef-nope"), path, "");
            assert_eq!(wrong.map_err(|e| e.status), Err(403), "{path}");
            assert_eq!(auth.decide(Some("Bearer 0123456789abcdef-http"), path, ""), Ok(()), "{path}");
            // The query is the page's alone.
            let by_query = auth.decide(None, path, "token=0123456789abcdef-http");
            assert_eq!(by_query.map_err(|e| e.status), Err(401), "{path}");
        }
        assert!(ApiAuth::new(false, None).is_err_and(|e| e.contains("KOALA_TOKEN")));
    }

    #[test]
    fn the_dashboard_page_takes_the_token_as_a_query_too() {
        let auth = ApiAuth::new(false, Some(token())).expect("a token is given");
        let refused = auth.decide(None, "/", "").expect_err("no token");
        assert!(refused.message.contains("/?token="), "{}", refused.message);
        assert_eq!(auth.decide(None, "/", "token=0123456789abcdef-http"), Ok(()));
        assert_eq!(auth.decide(None, "/index.html", "a=1&token=0123456789abcdef%2Dhttp"), Ok(()));
        let wrong = auth.decide(None, "/", "token=0123456789abcdef-nope");
        assert_eq!(wrong.map_err(|e| e.status), Err(403));
        assert_eq!(auth.decide(Some("Bearer 0123456789abcdef-http"), "/", ""), Ok(()));
    }

    #[test]
    fn on_loopback_nothing_is_required_but_a_given_token_is_checked() {
        let auth = ApiAuth::new(true, Some(token())).expect("loopback");
        assert_eq!(auth.decide(None, "/api/job", ""), Ok(()));
        assert_eq!(auth.decide(None, "/", ""), Ok(()));
        let wrong = auth.decide(Some("Bearer 0123456789abcdef-nope"), "/api/job", "");
        assert_eq!(wrong.map_err(|e| e.status), Err(403));
        assert_eq!(ApiAuth::new(true, None).expect("loopback").decide(None, "/metrics", ""), Ok(()));
    }

    #[test]
    fn query_tokens_are_percent_decoded() {
        assert_eq!(percent_decode("a%2Db+c%zz%4"), b"a-b c%zz%4".to_vec());
        assert_eq!(query_token("seconds=5&token="), None);
        assert_eq!(query_token("token=x%26y"), Some(b"x&y".to_vec()));
    }
}
