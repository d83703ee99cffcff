//! AWS STS as the `aws` provider meets it: moto's STS server (IRSA, AssumeRole counting),
//! replies for a [`FakeHttps`](super::FakeHttps) STS (what moto cannot produce: throttling,
//! 5xx, denials), botocore as the reference SigV4 signer and verifier, and the checks
//! aws-iam-authenticator makes on an EKS token before it calls STS.
//!
//! botocore and moto are Python: `python3` with `awscli` (botocore) and `moto[server]`.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use serde_json::{Value, json};
use tempfile::TempDir;

use super::Seen;
use crate::{describe, run, tempdir, wait_until};

/// The account of the fake STS replies' assumed role.
pub const ACCOUNT: &str = "123456789012";

/// aws-iam-authenticator's allow-list of query keys in a token's URL.
pub const ALLOWED_QUERY_KEYS: [&str; 9] = [
    "Action",
    "Version",
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-Security-Token",
    "X-Amz-Signature",
    "X-Amz-SignedHeaders",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/aws")
        .join(name)
}

fn python3() -> &'static str {
    "python3"
}

// ---------------------------------------------------------------------------------------
// EKS tokens
// ---------------------------------------------------------------------------------------

/// A decoded token: host and query (percent-decoded values).
#[derive(Debug)]
pub struct Decoded {
    /// The presigned URL's host.
    pub host: String,
    /// Its path.
    pub path: String,
    /// Its query, values percent-decoded, in order.
    pub query: Vec<(String, String)>,
}

impl Decoded {
    /// The value of query key `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Decodes `k8s-aws-v1.<base64url without padding>` into its presigned URL, or says why not.
pub fn decode_token(token: &str) -> Result<Decoded, String> {
    let b64 = token
        .strip_prefix("k8s-aws-v1.")
        .ok_or("no k8s-aws-v1. prefix")?;
    if b64.contains('=') {
        return Err("padded base64".into());
    }
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(b64)
        .map_err(|e| format!("not base64url: {e}"))?;
    let url = String::from_utf8(url).map_err(|_| "URL is not UTF-8")?;
    let rest = url.strip_prefix("https://").ok_or("not an https URL")?;
    let (host, rest) = rest.split_once('/').ok_or("no path")?;
    let (path, query) = rest.split_once('?').ok_or("no query")?;
    let mut pairs = Vec::new();
    for kv in query.split('&') {
        let (k, v) = kv.split_once('=').ok_or("query pair without =")?;
        pairs.push((k.to_owned(), percent_decode(v)?));
    }
    Ok(Decoded {
        host: host.to_owned(),
        path: format!("/{path}"),
        query: pairs,
    })
}

fn percent_decode(s: &str) -> Result<String, String> {
    let mut out = Vec::new();
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or("truncated %-escape")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| "bad %-escape")?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "escape is not UTF-8".into())
}

/// What aws-iam-authenticator checks before it calls STS: host, path, the query key
/// allow-list, Action, X-Amz-Expires, that x-k8s-aws-id is signed, and a fresh X-Amz-Date.
pub fn check_shape(token: &str, host: &str) -> Result<Decoded, String> {
    let d = decode_token(token)?;
    if d.host != host {
        return Err(format!("host {} (want {host})", d.host));
    }
    if d.path != "/" {
        return Err(format!("path {}", d.path));
    }
    let mut seen = std::collections::HashSet::new();
    for (k, _) in &d.query {
        if !ALLOWED_QUERY_KEYS.contains(&k.as_str()) {
            return Err(format!("query key {k} is not allowed"));
        }
        if !seen.insert(k.clone()) {
            return Err(format!("query key {k} repeated"));
        }
    }
    let want = [
        ("Action", "GetCallerIdentity"),
        ("Version", "2011-06-15"),
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Expires", "60"),
    ];
    for (k, v) in want {
        if d.get(k) != Some(v) {
            return Err(format!("{k}={:?} (want {v})", d.get(k)));
        }
    }
    let signed = d.get("X-Amz-SignedHeaders").unwrap_or_default();
    if !signed.split(';').any(|h| h == "x-k8s-aws-id") || !signed.split(';').any(|h| h == "host") {
        return Err(format!(
            "signed headers {signed:?} lack host or x-k8s-aws-id"
        ));
    }
    let date = d.get("X-Amz-Date").ok_or("no X-Amz-Date")?;
    let signed_at = amz_date(date)?;
    let age = SystemTime::now()
        .duration_since(signed_at)
        .unwrap_or_default();
    if age > Duration::from_secs(15 * 60) {
        return Err(format!("signed {age:?} ago: expired for the authenticator"));
    }
    let sig = d.get("X-Amz-Signature").unwrap_or_default();
    if sig.len() != 64 || !sig.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("signature {sig:?}"));
    }
    Ok(d)
}

/// `20240501T123456Z` → a time.
pub fn amz_date(date: &str) -> Result<SystemTime, String> {
    if date.len() != 16 {
        return Err(format!("X-Amz-Date {date:?}"));
    }
    let t = time::OffsetDateTime::parse(
        &rfc3339_of_amz_date(date),
        &time::format_description::well_known::Rfc3339,
    )
    .map_err(|e| format!("X-Amz-Date {date:?}: {e}"))?;
    Ok(
        SystemTime::UNIX_EPOCH
            + Duration::from_secs(u64::try_from(t.unix_timestamp()).unwrap_or(0)),
    )
}

/// `20240501T123456Z` → `2024-05-01T12:34:56Z`.
pub fn rfc3339_of_amz_date(date: &str) -> String {
    format!(
        "{}-{}-{}T{}:{}:{}Z",
        &date[0..4],
        &date[4..6],
        &date[6..8],
        &date[9..11],
        &date[11..13],
        &date[13..15]
    )
}

/// What `aws eks get-token` (botocore) prints for the same inputs and signing time.
pub fn botocore_token(case: &Value) -> String {
    let out = run(
        Command::new(python3())
            .arg(fixture("botocore_token.py"))
            .arg("token")
            .arg(case.to_string()),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "botocore_token.py failed (is the AWS CLI / botocore installed?): {}",
        describe(&out)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

// ---------------------------------------------------------------------------------------
// moto
// ---------------------------------------------------------------------------------------

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// `python3 -m moto.server` on 127.0.0.1; killed on drop.
#[derive(Debug)]
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:<port>`, for `AWS_ENDPOINT_URL_STS`.
    pub url: String,
    _log_dir: TempDir,
}

impl Moto {
    /// Starts moto and waits (at most 30 s) until it answers.
    pub fn start() -> Moto {
        let port = free_port();
        let log_dir = tempdir();
        let log = std::fs::File::create(log_dir.path().join("moto.log")).expect("moto log");
        let child = Command::new(python3())
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .expect("spawn moto (pip install 'moto[server]')");
        let mut moto = Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _log_dir: log_dir,
        };
        let up = wait_until(Duration::from_secs(30), || {
            matches!(
                http_get(&moto.url, "/moto-api/data.json", &[]),
                Ok((200, _))
            )
        });
        if !up {
            let _ = moto.child.kill();
            let log =
                std::fs::read_to_string(moto._log_dir.path().join("moto.log")).unwrap_or_default();
            panic!("moto did not answer within 30s (pip install 'moto[server]'):\n{log}");
        }
        moto
    }

    /// How many assumed-role sessions moto has issued (AssumeRole and
    /// AssumeRoleWithWebIdentity both create one).
    pub fn assumed_roles(&self) -> Vec<Value> {
        let (status, body) = http_get(&self.url, "/moto-api/data.json", &[]).expect("moto data");
        assert_eq!(status, 200, "{body}");
        let data: Value = serde_json::from_str(&body).expect("moto data JSON");
        data["sts"]["AssumedRole"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// moto's GetCallerIdentity for the key a token was signed with: the ARN it maps to.
    pub fn caller_arn(&self, token: &Decoded) -> String {
        let credential = token.get("X-Amz-Credential").expect("credential");
        // moto reads the key id from an Authorization header only (not from a presigned
        // query), so hand it the token's credential scope that way.
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential={credential}, SignedHeaders=host, Signature={}",
            token.get("X-Amz-Signature").unwrap_or_default()
        );
        let (status, body) = http_get(
            &self.url,
            "/?Action=GetCallerIdentity&Version=2011-06-15",
            &[("Authorization", &auth)],
        )
        .expect("moto GetCallerIdentity");
        assert_eq!(status, 200, "{body}");
        between(&body, "<Arn>", "</Arn>").unwrap_or_else(|| panic!("no Arn in {body}"))
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn between(text: &str, start: &str, end: &str) -> Option<String> {
    let from = text.find(start)? + start.len();
    let to = text[from..].find(end)? + from;
    Some(text[from..to].to_owned())
}

/// A plain HTTP/1.1 GET to `base` (http://127.0.0.1:port); (status, body).
fn http_get(base: &str, path: &str, headers: &[(&str, &str)]) -> std::io::Result<(u16, String)> {
    let addr = base.strip_prefix("http://").expect("http URL");
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

// ---------------------------------------------------------------------------------------
// Replies of a fake STS, and botocore's check of what it received
// ---------------------------------------------------------------------------------------

/// An `AssumeRole` answer: session `n` (key `ASIAFAKESTS<n>`), expiring `life` from now.
pub fn assume_role_ok(n: usize, life: Duration) -> String {
    let expiration = time::OffsetDateTime::now_utc() + life;
    let expiration = expiration
        .format(&time::format_description::well_known::Rfc3339)
        .expect("format");
    format!(
        r#"<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <AssumedRoleUser>
      <AssumedRoleId>AROAEXAMPLE:credbroker</AssumedRoleId>
      <Arn>arn:aws:sts::{ACCOUNT}:assumed-role/kueue/credbroker</Arn>
    </AssumedRoleUser>
    <Credentials>
      <AccessKeyId>ASIAFAKESTS{n:09}</AccessKeyId>
      <SecretAccessKey>fake-secret-{n}</SecretAccessKey>
      <SessionToken>fake-session-token-{n}</SessionToken>
      <Expiration>{expiration}</Expiration>
    </Credentials>
  </AssumeRoleResult>
  <ResponseMetadata><RequestId>req-{n}</RequestId></ResponseMetadata>
</AssumeRoleResponse>"#
    )
}

/// An STS error document with `code` and `message`.
pub fn sts_error(code: &str, message: &str) -> String {
    format!(
        r#"<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>
  <RequestId>err-1</RequestId>
</ErrorResponse>"#
    )
}

/// Checks with botocore that every request was SigV4-signed with the key `access_key_id`
/// / `secret_access_key`; `base_url` is the fake's URL the requests were sent to.
pub fn assert_sigv4_signed(
    requests: &[Seen],
    base_url: &str,
    access_key_id: &str,
    secret_access_key: &str,
) {
    let dir = tempdir();
    let spec = json!({
        "accessKeyId": access_key_id,
        "secretAccessKey": secret_access_key,
        "requests": requests.iter().map(|r| json!({
            "method": r.method,
            "url": format!("{base_url}{}", r.path_and_query),
            "headers": r.headers,
            "body": r.body,
        })).collect::<Vec<_>>(),
    });
    let path = dir.path().join("requests.json");
    std::fs::write(&path, spec.to_string()).expect("write requests");
    let out = run(
        Command::new(python3())
            .arg(fixture("verify_sigv4.py"))
            .arg(&path),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "SigV4 signatures of the STS requests do not verify: {}",
        describe(&out)
    );
}
