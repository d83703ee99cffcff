//! The provider's own HTTP calls: the JWT-bearer exchange's POST, the metadata server, and
//! IAM Credentials `generateAccessToken`; and what their failures mean.

use std::time::{Duration, SystemTime};

use serde::Deserialize;
use serde_json::json;

use crate::providers::upstream::{self, Route};
use crate::providers::{ProviderError, Secret};

use super::{Token, sanitize};

pub use upstream::REQUEST_TIMEOUT;
/// The metadata server is on the node (GKE) or the hypervisor (GCE): Google's own clients
/// give it a few seconds; off Google Cloud its address does not answer at all.
pub const METADATA_TIMEOUT: Duration = Duration::from_secs(3);
/// The header every metadata-server request must carry (and the server's proof it is one).
pub const METADATA_FLAVOR: (&str, &str) = ("Metadata-Flavor", "Google");
/// The metadata path of the default service account's access token.
pub const METADATA_TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";

/// The two HTTP clients (see [`upstream::http_client`]): upstream calls go through
/// `HTTPS_PROXY` / `NO_PROXY`; the metadata server is link-local and never behind a proxy.
#[derive(Debug)]
pub struct Clients {
    pub upstream: reqwest::Client,
    pub metadata: reqwest::Client,
}

/// Builds both clients.
pub fn client() -> Result<Clients, String> {
    let upstream = upstream::http_client(Route::Remote)
        .build()
        .map_err(|e| redacted_chain(&e))?;
    let metadata = upstream::http_client(Route::Local)
        .timeout(METADATA_TIMEOUT)
        .connect_timeout(METADATA_TIMEOUT)
        .build()
        .map_err(|e| redacted_chain(&e))?;
    Ok(Clients { upstream, metadata })
}

/// Why one of the provider's own calls failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// Nothing answered (DNS, connect, TLS, connection reset).
    Connect {
        url: String,
        why: String,
    },
    Timeout {
        url: String,
    },
    /// An HTTP error answer, with the OAuth2 `error` / `error_description` when it had them.
    Status {
        url: String,
        status: u16,
        detail: String,
    },
    /// A 200 answer that is not a token.
    BadResponse {
        url: String,
        why: String,
    },
    /// Failed before sending (e.g. signing).
    Local(String),
}

impl CallError {
    fn from_reqwest(url: &str, e: &reqwest::Error) -> Self {
        if e.is_timeout() {
            Self::Timeout {
                url: url.to_owned(),
            }
        } else {
            Self::Connect {
                url: url.to_owned(),
                why: redacted_chain(e),
            }
        }
    }

    /// Whether the upstream refused the identity (4xx other than 408/429).
    fn is_denied(&self) -> bool {
        matches!(self, Self::Status { status, .. }
            if (400..500).contains(status) && *status != 408 && *status != 429)
    }

    fn describe(&self) -> String {
        match self {
            Self::Connect { url, why } => format!("cannot reach {url}: {why}"),
            Self::Timeout { url } => {
                format!("{url} did not answer within {}s", REQUEST_TIMEOUT.as_secs())
            }
            Self::Status {
                url,
                status,
                detail,
            } => {
                if detail.is_empty() {
                    format!("{url} answered HTTP {status}")
                } else {
                    format!("{url} answered HTTP {status}: {detail}")
                }
            }
            Self::BadResponse { url, why } => format!("{url} answered 200 without a token: {why}"),
            Self::Local(why) => why.clone(),
        }
    }

    /// Refused (4xx) → Denied; 5xx, 408, 429, unreachable, bad answers → Unavailable (retried
    /// with backoff while a cached token is served); no answer in time → Timeout.
    pub fn into_provider_error(self, what: &str) -> ProviderError {
        let message = format!("{what}: {}", self.describe());
        match self {
            _ if self.is_denied() => ProviderError::Denied(message),
            Self::Timeout { .. } => ProviderError::Timeout(message),
            _ => ProviderError::Unavailable(message),
        }
    }

    /// The metadata server is the last ADC source: when it cannot be reached, say everything
    /// that was tried, so "no credentials anywhere" reads as such.
    pub fn into_metadata_error(self, host: &str, tried: &[String]) -> ProviderError {
        match self {
            Self::Connect { .. } | Self::Timeout { .. } => {
                let why = match &self {
                    Self::Connect { why, .. } => why.clone(),
                    _ => format!("no answer within {}s", METADATA_TIMEOUT.as_secs()),
                };
                ProviderError::Unavailable(format!(
                    "no Google credentials found: {}; and the metadata server at {host} did not answer ({why}). \
                     Set GOOGLE_APPLICATION_CREDENTIALS or gcp.credentialsFile to a credentials file, \
                     or run on GKE with Workload Identity (or GCE)",
                    tried.join("; ")
                ))
            }
            other => other.into_provider_error(&format!("metadata server at {host}")),
        }
    }
}

/// An error and its causes (reqwest's own message omits the cause), redacted: the
/// library's errors may quote an upstream's answer.
pub fn redacted_chain(e: &(dyn std::error::Error + 'static)) -> String {
    sanitize(&upstream::error_chain(e))
}

/// The OAuth2 token response (RFC 6749 §5.1) and the metadata server's, which has the same shape.
#[derive(Deserialize)]
struct OAuthToken {
    access_token: String,
    expires_in: Option<f64>,
}

/// RFC 6749 §5.2 error fields; Google's other APIs nest `{error: {message, status}}`.
fn error_detail(body: &str) -> String {
    let Ok(json) = serde_json::from_str::<serde_json::Value>(body) else {
        return String::new();
    };
    let mut parts = Vec::new();
    match &json["error"] {
        serde_json::Value::String(code) => parts.push(code.clone()),
        serde_json::Value::Object(obj) => {
            for key in ["status", "message"] {
                if let Some(s) = obj.get(key).and_then(|v| v.as_str()) {
                    parts.push(s.to_owned());
                }
            }
        }
        _ => {}
    }
    if let Some(d) = json["error_description"].as_str() {
        parts.push(d.to_owned());
    }
    sanitize(&parts.join(": "))
}

/// Sends a request whose answer is an OAuth2 token; the expiry counts from `started`.
pub async fn oauth_token(
    request: reqwest::RequestBuilder,
    url: &str,
    started: SystemTime,
) -> Result<Token, CallError> {
    let body = send(request, url).await?;
    let parsed: OAuthToken = serde_json::from_str(&body).map_err(|e| CallError::BadResponse {
        url: url.to_owned(),
        why: format!("{:?} error at column {}", e.classify(), e.column()),
    })?;
    let expires_in = parsed
        .expires_in
        .filter(|s| s.is_finite() && *s > 0.0)
        .ok_or_else(|| CallError::BadResponse {
            url: url.to_owned(),
            why: "no positive expires_in".into(),
        })?;
    if parsed.access_token.is_empty() {
        return Err(CallError::BadResponse {
            url: url.to_owned(),
            why: "empty access_token".into(),
        });
    }
    Ok(Token {
        secret: Secret::new(
            crate::providers::bearer_token(&parsed.access_token).map_err(|e| {
                CallError::BadResponse {
                    url: url.to_owned(),
                    why: format!("access_token {e}"),
                }
            })?,
        ),
        expires_at: started + Duration::from_secs_f64(expires_in),
    })
}

/// Sends a request and returns the body of a 2xx answer.
async fn send(request: reqwest::RequestBuilder, url: &str) -> Result<String, CallError> {
    let response = request
        .send()
        .await
        .map_err(|e| CallError::from_reqwest(url, &e))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .map_err(|e| CallError::from_reqwest(url, &e))?;
    if !status.is_success() {
        return Err(CallError::Status {
            url: url.to_owned(),
            status: status.as_u16(),
            detail: error_detail(&body),
        });
    }
    Ok(body)
}

/// The default service account's token from the metadata server (GKE Workload Identity maps
/// it to the pod's Kubernetes service account).
pub async fn metadata_token(
    clients: &Clients,
    host: &str,
    scopes: &[String],
) -> Result<Token, CallError> {
    let url = format!("http://{host}{METADATA_TOKEN_PATH}");
    let started = SystemTime::now();
    let request = clients
        .metadata
        .get(&url)
        .header(METADATA_FLAVOR.0, METADATA_FLAVOR.1)
        .query(&[("scopes", scopes.join(","))]);
    oauth_token(request, &url, started).await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct GeneratedToken {
    access_token: String,
    expire_time: String,
}

/// IAM Credentials `generateAccessToken`: `source` (a token of the caller) buys a token of
/// `target`, through `delegates` when the caller may only impersonate the first of them.
pub async fn generate_access_token(
    clients: &Clients,
    endpoint: &str,
    source: &Secret,
    target: &str,
    delegates: &[String],
    scopes: &[String],
) -> Result<Token, CallError> {
    let url = format!(
        "{}/v1/projects/-/serviceAccounts/{target}:generateAccessToken",
        endpoint.trim_end_matches('/')
    );
    let delegates: Vec<String> = delegates.iter().map(|d| delegate_name(d)).collect();
    let mut body = json!({
        "scope": scopes,
        "lifetime": format!("{}s", super::IMPERSONATED_LIFETIME.as_secs()),
    });
    if !delegates.is_empty() {
        body["delegates"] = json!(delegates);
    }
    let request = clients
        .upstream
        .post(&url)
        .bearer_auth(source.expose())
        .json(&body);
    let text = send(request, &url).await?;
    let parsed: GeneratedToken =
        serde_json::from_str(&text).map_err(|e| CallError::BadResponse {
            url: url.clone(),
            why: format!("{:?} error at column {}", e.classify(), e.column()),
        })?;
    let expires = time::OffsetDateTime::parse(
        &parsed.expire_time,
        &time::format_description::well_known::Rfc3339,
    )
    .map_err(|_| CallError::BadResponse {
        url: url.clone(),
        why: format!("expireTime {:?} is not RFC 3339", parsed.expire_time),
    })?;
    let expires_at = SystemTime::from(expires);
    if parsed.access_token.is_empty() {
        return Err(CallError::BadResponse {
            url,
            why: "empty accessToken".into(),
        });
    }
    Ok(Token {
        secret: Secret::new(
            crate::providers::bearer_token(&parsed.access_token).map_err(|e| {
                CallError::BadResponse {
                    url: url.clone(),
                    why: format!("accessToken {e}"),
                }
            })?,
        ),
        expires_at,
    })
}

/// IAM wants delegates as resource names; an email alone is accepted in the config.
pub fn delegate_name(delegate: &str) -> String {
    if delegate.starts_with("projects/") {
        delegate.to_owned()
    } else {
        format!("projects/-/serviceAccounts/{delegate}")
    }
}
