//! Credentials held between tokens, and what an SDK credential failure means for the cache.
//!
//! The SDK's credential providers (the default chain, `AssumeRoleProvider`) fetch on every
//! call: inside an SDK client the client's identity cache sits in front of them, but we sign
//! tokens ourselves, outside any client. [`HeldCredentials`] is that cache for us: one per
//! credential source (the chain, or one role), one upstream call at a time, reused until
//! shortly before the credentials expire. Signing a token is then local.

use std::error::Error as StdError;
use std::fmt;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{self, ProvideCredentials, SharedCredentialsProvider};
use aws_sdk_sts::error::SdkError;
use aws_sdk_sts::operation::assume_role::AssumeRoleError;
use aws_sdk_sts::operation::assume_role_with_web_identity::AssumeRoleWithWebIdentityError;

/// Fresh credentials are renewed this long before they expire, so a token signed with them
/// can live its full 14 minutes (the token's lifetime plus one minute of margin).
pub const RENEW_BEFORE_EXPIRY: Duration = Duration::from_secs(15 * 60);
/// Credentials without an expiry (access keys from the environment or a profile) are read
/// again after this long, so a rotated key is picked up: the SDK's own identity cache uses
/// the same 15 minutes for identities that carry no expiry.
pub const REREAD_WITHOUT_EXPIRY: Duration = Duration::from_secs(15 * 60);
/// When a renewal fails, credentials still valid for longer than this are used meanwhile
/// (the broker cache's stale margin: a token signed with them lives at least this long).
pub const STALE_USE_MARGIN: Duration = Duration::from_secs(60);

/// The credential sources the SDK's default chain tries, in its order; named in the error
/// when none of them has credentials.
pub const CHAIN_SOURCES: &str = "environment (AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY), \
shared config and credentials files (AWS_PROFILE, ~/.aws/config, ~/.aws/credentials), \
web identity / IRSA (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE), \
container credentials / EKS Pod Identity / ECS (AWS_CONTAINER_CREDENTIALS_FULL_URI or \
AWS_CONTAINER_CREDENTIALS_RELATIVE_URI), EC2 instance metadata (IMDSv2)";

/// Error codes with which STS refuses an identity for good (until someone changes IAM):
/// the broker drops what it holds instead of serving it through the "outage".
const DENIED_CODES: &[&str] = &[
    "AccessDenied",
    "AccessDeniedException",
    "InvalidIdentityToken",
    "IDPRejectedClaim",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "UnrecognizedClientException",
    "RegionDisabledException",
];

/// One credential source and what it last gave us.
pub struct HeldCredentials {
    source: SharedCredentialsProvider,
    held: tokio::sync::Mutex<Option<Held>>,
}

struct Held {
    creds: Credentials,
    renew_at: SystemTime,
}

impl fmt::Debug for HeldCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Neither keys nor tokens: only whether something is held and until when.
        let held = self
            .held
            .try_lock()
            .ok()
            .and_then(|h| h.as_ref().map(|h| h.renew_at));
        f.debug_struct("HeldCredentials")
            .field("renew_at", &held)
            .finish_non_exhaustive()
    }
}

impl HeldCredentials {
    pub fn new(source: SharedCredentialsProvider) -> Self {
        Self {
            source,
            held: tokio::sync::Mutex::new(None),
        }
    }

    /// Credentials to sign with: the held ones while they are fresh, else new ones from the
    /// source. Concurrent callers wait for one upstream call (the lock is held across it).
    pub async fn get(&self) -> Result<Credentials, CredentialsError> {
        self.get_at(SystemTime::now()).await
    }

    /// [`Self::get`] as if the clock read `now` (tests move it forward).
    pub async fn get_at(&self, now: SystemTime) -> Result<Credentials, CredentialsError> {
        let mut held = self.held.lock().await;
        if let Some(h) = held.as_ref()
            && now < h.renew_at
        {
            return Ok(h.creds.clone());
        }
        match self.source.provide_credentials().await {
            Ok(creds) => {
                let renew_at = renew_at(&creds, now);
                *held = Some(Held {
                    creds: creds.clone(),
                    renew_at,
                });
                Ok(creds)
            }
            Err(error) => {
                let keep = !matches!(classify(&error), Failure::Denied(_))
                    && held.as_ref().is_some_and(|h| usable(&h.creds, now));
                if keep && let Some(h) = held.as_ref() {
                    tracing::warn!(
                        error = crate::base::text::quote(&crate::providers::upstream::error_chain(
                            &error
                        ))
                        .as_str(),
                        "renewing AWS credentials failed; signing with the held ones until they expire"
                    );
                    return Ok(h.creds.clone());
                }
                *held = None;
                Err(error)
            }
        }
    }
}

/// So one held source can be the base credentials of an `AssumeRoleProvider`: the role's
/// STS calls then reuse the held chain credentials instead of re-running the chain.
#[derive(Debug, Clone)]
pub struct Shared(pub std::sync::Arc<HeldCredentials>);

impl ProvideCredentials for Shared {
    fn provide_credentials<'a>(&'a self) -> provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        provider::future::ProvideCredentials::new(self.0.get())
    }
}

/// When credentials fetched at `now` should be renewed: [`RENEW_BEFORE_EXPIRY`] before they
/// expire, or at half their life when they live shorter than twice that (a 15-minute
/// AssumeRole session), so short sessions are not renewed on every token.
pub fn renew_at(creds: &Credentials, now: SystemTime) -> SystemTime {
    match creds.expiry() {
        None => now + REREAD_WITHOUT_EXPIRY,
        Some(expiry) => {
            let life = expiry.duration_since(now).unwrap_or_default();
            expiry - RENEW_BEFORE_EXPIRY.min(life / 2)
        }
    }
}

/// Whether held credentials may still sign while renewing them fails.
fn usable(creds: &Credentials, now: SystemTime) -> bool {
    creds.expiry().is_none_or(|e| e > now + STALE_USE_MARGIN)
}

/// What a credential failure means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No source in the chain had credentials.
    NoCredentials,
    /// STS refused the identity: `code: message`.
    Denied(String),
    /// A source did not answer in time.
    Timeout,
    /// Anything else (throttling, 5xx, network, a malformed answer): worth retrying.
    Transient,
}

/// Classifies by the first STS error in the chain of causes that has a code, else by the
/// SDK's own credential error kinds.
pub fn classify(error: &CredentialsError) -> Failure {
    let mut no_credentials = false;
    let mut timeout = false;
    let mut next: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = next {
        if let Some((code, message, status)) = sts_error(e) {
            if DENIED_CODES.contains(&code.as_str()) || (status == Some(403) && code.is_empty()) {
                return Failure::Denied(if message.is_empty() {
                    code
                } else {
                    format!("{code}: {message}")
                });
            }
            if !code.is_empty() {
                return Failure::Transient;
            }
        }
        // Instance metadata is the chain's last source: the chain only reaches it when
        // every other source had nothing, so its refusal (403 when IMDS is disabled, or
        // any error) means "no credentials anywhere", to be told with the whole list.
        if e.is::<aws_config::imds::client::error::ImdsError>() {
            no_credentials = true;
        }
        match e.downcast_ref::<CredentialsError>() {
            Some(CredentialsError::CredentialsNotLoaded(_)) => no_credentials = true,
            Some(CredentialsError::ProviderTimedOut(_)) => timeout = true,
            _ => {}
        }
        next = e.source();
    }
    if no_credentials {
        Failure::NoCredentials
    } else if timeout {
        Failure::Timeout
    } else {
        Failure::Transient
    }
}

/// (code, message, HTTP status) of an STS AssumeRole / AssumeRoleWithWebIdentity error.
fn sts_error(e: &(dyn StdError + 'static)) -> Option<(String, String, Option<u16>)> {
    fn parts<E: aws_sdk_sts::error::ProvideErrorMetadata>(
        e: &SdkError<E>,
    ) -> (String, String, Option<u16>) {
        let status = e.raw_response().map(|r| r.status().as_u16());
        match e.as_service_error() {
            Some(service) => (
                service.code().unwrap_or_default().to_owned(),
                service.message().unwrap_or_default().to_owned(),
                status,
            ),
            None => (String::new(), String::new(), status),
        }
    }
    if let Some(e) = e.downcast_ref::<SdkError<AssumeRoleError>>() {
        return Some(parts(e));
    }
    if let Some(e) = e.downcast_ref::<SdkError<AssumeRoleWithWebIdentityError>>() {
        return Some(parts(e));
    }
    None
}
