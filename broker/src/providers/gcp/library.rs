//! Credential files handled by Google's `google-cloud-auth`: external_account (workload
//! identity federation: file, URL, executable or AWS sourced subject tokens, STS, optional
//! service-account impersonation), authorized_user, external_account_authorized_user and
//! impersonated_service_account. The library honours every URL in the file (token_url,
//! service_account_impersonation_url, credential_source.url, ...), which is also what lets
//! the tests point them at local fakes.

use std::time::{Duration, SystemTime};

use google_cloud_auth::credentials::{
    AccessTokenCredentials, external_account, external_account_authorized_user, impersonated,
    user_account,
};
use google_cloud_auth::errors::CredentialsError;
use serde_json::Value;

use crate::providers::{ProviderError, Secret};

use super::http::{REQUEST_TIMEOUT, redacted_chain};
use super::{
    IMPERSONATED_LIFETIME, LIBRARY_IMPERSONATION_LIFETIME, OPAQUE_TOKEN_LIFETIME, Token, json_str,
};

/// A credential file type the library handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AuthorizedUser,
    ExternalAccount,
    ExternalAccountAuthorizedUser,
    ImpersonatedServiceAccount,
}

impl Kind {
    pub fn from_type(t: &str) -> Result<Self, String> {
        Ok(match t {
            "authorized_user" => Self::AuthorizedUser,
            "external_account" => Self::ExternalAccount,
            "external_account_authorized_user" => Self::ExternalAccountAuthorizedUser,
            "impersonated_service_account" => Self::ImpersonatedServiceAccount,
            other => {
                return Err(format!(
                    "field `type` is {other:?}; expected service_account, authorized_user, external_account, external_account_authorized_user or impersonated_service_account"
                ));
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AuthorizedUser => "authorized_user",
            Self::ExternalAccount => "external_account",
            Self::ExternalAccountAuthorizedUser => "external_account_authorized_user",
            Self::ImpersonatedServiceAccount => "impersonated_service_account",
        }
    }

    /// The fields without which the library cannot build the credential: checked here so the
    /// error names them.
    pub fn check_fields(self, json: &Value) -> Result<(), String> {
        let strings: &[&str] = match self {
            Self::AuthorizedUser => &["client_id", "client_secret", "refresh_token"],
            Self::ExternalAccount => &["audience", "subject_token_type", "token_url"],
            Self::ExternalAccountAuthorizedUser => &["audience", "refresh_token", "token_url"],
            Self::ImpersonatedServiceAccount => &["service_account_impersonation_url"],
        };
        for field in strings {
            match json.get(*field) {
                None => return Err(format!("field `{field}` is missing")),
                Some(v) if json_str(json, field).is_none() => {
                    let why = if v.is_string() {
                        "empty"
                    } else {
                        "not a string"
                    };
                    return Err(format!("field `{field}` is {why}"));
                }
                Some(_) => {}
            }
        }
        let object = match self {
            Self::ExternalAccount => Some("credential_source"),
            Self::ImpersonatedServiceAccount => Some("source_credentials"),
            _ => None,
        };
        if let Some(field) = object {
            match json.get(field) {
                None => return Err(format!("field `{field}` is missing")),
                Some(v) if !v.is_object() => {
                    return Err(format!("field `{field}` is not an object"));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Who the file authenticates as, as far as the file tells (empty: use the file's path).
    pub fn identity(self, json: &Value) -> String {
        let target = json_str(json, "service_account_impersonation_url").map(impersonated_email);
        match self {
            Self::ExternalAccount => {
                let audience = json_str(json, "audience").unwrap_or_default();
                match target {
                    Some(sa) => format!("external_account:{audience}:as:{sa}"),
                    None => format!("external_account:{audience}"),
                }
            }
            Self::ExternalAccountAuthorizedUser => format!(
                "external_account_authorized_user:{}",
                json_str(json, "audience").unwrap_or_default()
            ),
            Self::ImpersonatedServiceAccount => {
                format!(
                    "impersonated_service_account:{}",
                    target.unwrap_or_default()
                )
            }
            Self::AuthorizedUser => String::new(),
        }
    }

    /// How long a token the library returned lives at least, counted from the start of the
    /// request that got it (see the module docs of `gcp` for why this is not read from the
    /// library).
    pub fn assumed_lifetime(self, json: &Value) -> Duration {
        match self {
            Self::ImpersonatedServiceAccount => IMPERSONATED_LIFETIME,
            Self::ExternalAccount
                if json_str(json, "service_account_impersonation_url").is_some() =>
            {
                LIBRARY_IMPERSONATION_LIFETIME
            }
            _ => OPAQUE_TOKEN_LIFETIME,
        }
    }
}

/// `…/serviceAccounts/EMAIL:generateAccessToken` → `EMAIL`.
fn impersonated_email(url: &str) -> String {
    let tail = url.rsplit('/').next().unwrap_or(url);
    tail.split(':').next().unwrap_or(tail).to_owned()
}

/// One token from a freshly built library credential (so it was minted by this call, not
/// served from the library's cache, and its assumed lifetime holds).
pub async fn fetch(
    kind: Kind,
    json: Value,
    scopes: &[String],
    what: &str,
) -> Result<Token, ProviderError> {
    let started = SystemTime::now();
    let lifetime = kind.assumed_lifetime(&json);
    let built = match kind {
        Kind::AuthorizedUser => user_account::Builder::new(json)
            .with_scopes(scopes.iter().cloned())
            .build_access_token_credentials(),
        Kind::ExternalAccount => external_account::Builder::new(json)
            .with_scopes(scopes.iter().cloned())
            .build_access_token_credentials(),
        // The file's scopes were fixed when it was made (gcloud's workforce login).
        Kind::ExternalAccountAuthorizedUser => {
            external_account_authorized_user::Builder::new(json).build_access_token_credentials()
        }
        Kind::ImpersonatedServiceAccount => impersonated::Builder::new(json)
            .with_scopes(scopes.iter().cloned())
            .with_lifetime(IMPERSONATED_LIFETIME)
            .build_access_token_credentials(),
    };
    let credentials: AccessTokenCredentials = built.map_err(|e| {
        ProviderError::Unavailable(format!("{what}: cannot use it: {}", redacted_chain(&e)))
    })?;
    let token = tokio::time::timeout(REQUEST_TIMEOUT, credentials.access_token())
        .await
        .map_err(|_| {
            ProviderError::Timeout(format!(
                "{what}: no token within {}s",
                REQUEST_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| classify(&e, what))?;
    if token.token.is_empty() {
        return Err(ProviderError::Unavailable(format!(
            "{what}: the token endpoint returned an empty token"
        )));
    }
    Ok(Token {
        secret: Secret::new(crate::providers::bearer_token(&token.token).map_err(|e| {
            ProviderError::Unavailable(format!(
                "{what}: the token endpoint returned a token that {e}"
            ))
        })?),
        expires_at: started + lifetime,
    })
}

/// The library's error, as the cache needs it: transient → Unavailable (retried with
/// backoff); refused by the upstream (an HTTP 4xx other than 408/429, or `invalid_grant`)
/// → Denied; other permanent failures (an unreadable subject-token file, an executable not
/// allowed) → Unavailable, so a fixed file is picked up on the next retry.
pub fn classify(e: &CredentialsError, what: &str) -> ProviderError {
    let message = format!("{what}: {}", redacted_chain(e));
    let mut status = None;
    let mut timed_out = false;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(r) = err.downcast_ref::<reqwest::Error>() {
            status = status.or(r.status().map(|s| s.as_u16()));
            timed_out |= r.is_timeout();
        }
        // The library's impersonation step reports HTTP errors as gax errors.
        if let Some(g) = err.downcast_ref::<google_cloud_gax::error::Error>() {
            status = status.or(g.http_status_code());
            timed_out |= g.is_timeout();
        }
        next = err.source();
    }
    let refused = status.is_some_and(|s| (400..500).contains(&s) && s != 408 && s != 429)
        || message.contains("invalid_grant");
    if e.is_transient() {
        if timed_out {
            ProviderError::Timeout(message)
        } else {
            ProviderError::Unavailable(message)
        }
    } else if refused {
        ProviderError::Denied(message)
    } else {
        ProviderError::Unavailable(message)
    }
}
