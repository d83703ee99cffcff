//! The EKS token itself: a presigned STS `GetCallerIdentity` URL, as aws-iam-authenticator
//! verifies it and `aws eks get-token` makes it. Pure functions of their inputs (credentials,
//! region, cluster, signing time), so they are checked byte for byte against botocore.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use base64::Engine as _;

use crate::config::providers::aws::AwsStsEndpoint;

/// What aws-iam-authenticator looks for in front of the base64 URL.
pub const TOKEN_PREFIX: &str = "k8s-aws-v1.";
/// The header that binds a token to one cluster; aws-iam-authenticator requires it signed.
pub const CLUSTER_ID_HEADER: &str = "x-k8s-aws-id";
/// `X-Amz-Expires` of the presigned URL: what aws-iam-authenticator's token generator and
/// `aws eks get-token` use. The authenticator ignores the value and applies its own window.
pub const PRESIGN_EXPIRES: Duration = Duration::from_secs(60);
/// aws-iam-authenticator accepts a token for 15 minutes after its `X-Amz-Date`
/// (`presignedURLExpiration` in its token.go); `aws eks get-token` reports 14 minutes as the
/// expiry, one minute of margin for clock skew. We do the same.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(14 * 60);
/// The STS API version every SDK sends with `GetCallerIdentity`.
const STS_API_VERSION: &str = "2011-06-15";
/// The global STS endpoint, and the region SigV4 signs for it (botocore and the Go SDK do
/// the same; aws-iam-authenticator accepts this host in every commercial region).
const GLOBAL_STS_HOST: &str = "sts.amazonaws.com";
const GLOBAL_SIGNING_REGION: &str = "us-east-1";

/// A signed token and when it stops being usable.
#[derive(Clone, PartialEq)]
pub struct Presigned {
    pub token: String,
    pub expires_at: SystemTime,
}

impl std::fmt::Debug for Presigned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presigned")
            .field("token", &"[redacted]")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// The STS host a token names and the region it is signed for.
///
/// China regions have their own DNS suffix and no global endpoint, so they always use the
/// regional one.
pub fn sts_host(region: &str, endpoint: AwsStsEndpoint) -> (String, String) {
    if region.starts_with("cn-") {
        return (format!("sts.{region}.amazonaws.com.cn"), region.to_owned());
    }
    match endpoint {
        AwsStsEndpoint::Regional => (format!("sts.{region}.amazonaws.com"), region.to_owned()),
        AwsStsEndpoint::Global => (GLOBAL_STS_HOST.to_owned(), GLOBAL_SIGNING_REGION.to_owned()),
    }
}

/// The region in an EKS API server URL: `https://<id>.<shard>.<region>.eks.amazonaws.com`
/// (or `….eks.amazonaws.com.cn`). `None` for any other server.
pub fn region_from_server(server: &str) -> Option<String> {
    let rest = server
        .strip_prefix("https://")
        .or_else(|| server.strip_prefix("http://"))
        .unwrap_or(server);
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit('@').next()?;
    let host = host
        .split(':')
        .next()?
        .trim_end_matches('.')
        .to_ascii_lowercase();
    let before = host
        .strip_suffix(".eks.amazonaws.com")
        .or_else(|| host.strip_suffix(".eks.amazonaws.com.cn"))?;
    let region = before.rsplit('.').next()?;
    crate::config::providers::aws::Config::check_region(region)
        .ok()
        .map(|()| region.to_owned())
}

/// Signs the token for `cluster_id` (the `x-k8s-aws-id` value) at `now`. Its expiry is the
/// earlier of `now` + [`TOKEN_LIFETIME`] and the credentials' own expiry: a token must not
/// outlive the session that signed it (aws-iam-authenticator #724).
pub fn presign(
    creds: &Credentials,
    region: &str,
    endpoint: AwsStsEndpoint,
    cluster_id: &str,
    now: SystemTime,
) -> Result<Presigned, String> {
    let expires_at = match creds.expiry() {
        Some(expiry) if expiry <= now => {
            return Err(format!(
                "the AWS credentials expired at {} before the token could be signed",
                humantime::format_rfc3339_seconds(expiry)
            ));
        }
        Some(expiry) => expiry.min(now + TOKEN_LIFETIME),
        None => now + TOKEN_LIFETIME,
    };
    let (host, signing_region) = sts_host(region, endpoint);
    let base = format!("https://{host}/?Action=GetCallerIdentity&Version={STS_API_VERSION}");

    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(PRESIGN_EXPIRES);
    let identity: Identity = creds.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(&signing_region)
        .name("sts")
        .time(now)
        .settings(settings)
        .build()
        .map_err(|e| format!("cannot set up SigV4 signing: {e}"))?
        .into();
    let request = SignableRequest::new(
        "GET",
        base.as_str(),
        [(CLUSTER_ID_HEADER, cluster_id)].into_iter(),
        // A GET has an empty body; botocore (so `aws eks get-token`) signs its SHA-256
        // rather than UNSIGNED-PAYLOAD, and STS accepts either.
        SignableBody::Bytes(&[]),
    )
    .map_err(|e| format!("cannot build the GetCallerIdentity request for {host}: {e}"))?;
    let (instructions, _signature) = sign(request, &params)
        .map_err(|e| format!("cannot sign the GetCallerIdentity request: {e}"))?
        .into_parts();
    let (_headers, query) = instructions.into_parts();

    let mut url = base;
    for (name, value) in ordered(query) {
        url.push('&');
        url.push_str(name);
        url.push('=');
        url.push_str(&uri_encode(&value));
    }
    let token = format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(url.as_bytes())
    );
    Ok(Presigned { token, expires_at })
}

/// The signing parameters in botocore's order (the security token before the signature), so
/// the token is byte-for-byte what `aws eks get-token` prints for the same inputs. Order does
/// not matter to STS; it makes the tokens comparable as strings.
fn ordered(
    mut query: Vec<(&'static str, Cow<'static, str>)>,
) -> Vec<(&'static str, Cow<'static, str>)> {
    const ORDER: [&str; 7] = [
        "X-Amz-Algorithm",
        "X-Amz-Credential",
        "X-Amz-Date",
        "X-Amz-Expires",
        "X-Amz-SignedHeaders",
        "X-Amz-Security-Token",
        "X-Amz-Signature",
    ];
    query.sort_by_key(|(name, _)| ORDER.iter().position(|o| o == name).unwrap_or(ORDER.len()));
    query
}

/// SigV4's URI encoding: everything but `A–Z a–z 0–9 - _ . ~` as `%XX` (upper case).
fn uri_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
