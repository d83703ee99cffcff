//! The `aws` provider end to end: the real broker and shim, moto's server standing in for
//! STS (IRSA, AssumeRole counting), a TLS fake STS for the failures moto cannot produce,
//! botocore (the AWS CLI's `aws eks get-token` code) as the reference signer, and kubectl
//! against an EKS-shaped TLS API server that decodes and checks every token it receives.
//! The fakes and checks live in the harness (`credbroker_tests::fakes::sts`).
//!
//! The broker runs with a cleared environment plus exactly the AWS variables each test sets
//! (HOME in a temp dir, instance metadata disabled), so nothing on the machine leaks in.

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use credbroker_proto::v1::Cluster;
use credbroker_tests::fakes::sts::{
    ACCOUNT, Moto, amz_date, assert_sigv4_signed, assume_role_ok, botocore_token, check_shape,
    decode_token, rfc3339_of_amz_date, sts_error,
};
use credbroker_tests::{
    Broker, FakeHttps, Kubeconfig, Reply, Seen, V1, V1BETA1, assert_credential, assert_shim_error,
    cluster, describe, exec_info, get_token, get_token_blocking, kubectl, provider, run_shim,
    tempdir, wait_until, write_kubeconfig, yaml_str,
};
use serde_json::{Value, json};

const STATIC_KEY: &str = "AKIAIOSFODNN7EXAMPLE";
const STATIC_SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

// ---------------------------------------------------------------------------------------
// A broker with a controlled environment
// ---------------------------------------------------------------------------------------

/// `credbroker serve` with a cleared environment plus `env` (after the defaults: `HOME` in
/// its temp dir with no AWS config or credentials files, instance metadata disabled, `RUST_LOG=info`).
/// `providers` are entries of [`aws_provider`].
fn aws_broker(providers: &[String], env: &[(&str, String)]) -> Broker {
    aws_broker_of(None, providers, env)
}

/// [`aws_broker`] running `binary` (another build's broker) when given.
fn aws_broker_of(
    binary: Option<std::path::PathBuf>,
    providers: &[String],
    env: &[(&str, String)],
) -> Broker {
    let mut builder = Broker::builder().providers(providers).env_clear().home();
    if let Some(binary) = binary {
        builder = builder.binary(&binary);
    }
    let home = builder.home_dir();
    builder
        .env("AWS_CONFIG_FILE", home.join("no-config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", home.join("no-credentials"))
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("RUST_LOG", "info")
        .envs(env)
        .start()
}

/// A `type: aws` provider entry; `aws` is the inside of the `aws:` flow mapping.
fn aws_provider(name: &str, aws: &str) -> String {
    provider(name, "aws", &format!("{{{aws}}}"), &[])
}

fn static_keys(session_token: Option<&str>) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("AWS_ACCESS_KEY_ID", STATIC_KEY.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", STATIC_SECRET.to_owned()),
    ];
    if let Some(t) = session_token {
        env.push(("AWS_SESSION_TOKEN", t.to_owned()));
    }
    env
}

/// One shim run for `cluster_config` (and `server`), asserting success; the token.
fn token_for(broker: &Broker, server: &str, cluster_config: Value) -> credbroker_tests::Credential {
    token_for_with(None, broker, server, cluster_config)
}

/// [`token_for`] with the shim `shim` (another build's) when given.
fn token_for_with(
    shim: Option<&Path>,
    broker: &Broker,
    server: &str,
    cluster_config: Value,
) -> credbroker_tests::Credential {
    let info = exec_info(V1, server, cluster_config);
    let args = ["--provider", "eks"];
    let out = match shim {
        Some(shim) => credbroker_tests::run_shim_of(shim, broker.socket(), &args, Some(&info)),
        None => run_shim(broker.socket(), &args, Some(&info)),
    };
    if !out.status.success() {
        panic!(
            "shim failed: {}\nbroker log:\n{}",
            describe(&out),
            broker.logs()
        );
    }
    assert_credential(&out, V1)
}

fn shim_fails(broker: &Broker, server: &str, cluster_config: Value) -> Output {
    let info = exec_info(V1, server, cluster_config);
    run_shim(broker.socket(), &["--provider", "eks"], Some(&info))
}

/// Checks with botocore that every request was SigV4-signed with the static test key.
fn assert_signed_with_static_key(requests: &[Seen], base_url: &str) {
    assert_sigv4_signed(requests, base_url, STATIC_KEY, STATIC_SECRET);
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// Same credentials, cluster, region and signing time: the broker's token is byte for byte
/// the one `aws eks get-token`'s code (botocore) makes, with and without a session token.
#[test]
fn token_is_what_aws_eks_get_token_signs() {
    for session in [None, Some("FwoGZXIvYXdzEJr//////////wEaDH+session/token==")] {
        let broker = aws_broker(
            &[aws_provider("eks", "region: eu-west-1")],
            &static_keys(session),
        );
        let cred = token_for(&broker, "https://10.1.2.3", json!({"clusterName": "alpha"}));
        let d = check_shape(&cred.token, "sts.eu-west-1.amazonaws.com").unwrap();
        assert_eq!(
            d.get("X-Amz-Credential")
                .unwrap_or_default()
                .split('/')
                .next(),
            Some(STATIC_KEY)
        );
        assert_eq!(d.get("X-Amz-Security-Token"), session);
        let date = d.get("X-Amz-Date").expect("date");
        let mut case = json!({
            "accessKeyId": STATIC_KEY,
            "secretAccessKey": STATIC_SECRET,
            "region": "eu-west-1",
            "clusterId": "alpha",
            "time": rfc3339_of_amz_date(date),
            "stsEndpoint": "regional",
        });
        if let Some(s) = session {
            case["sessionToken"] = json!(s);
        }
        let want = botocore_token(&case);
        let theirs = decode_token(&want).unwrap();
        assert_eq!(d.get("X-Amz-Signature"), theirs.get("X-Amz-Signature"));
        assert_eq!(cred.token, want);
        // Static keys have no expiry: the token's own 14 minutes, and the shim is told to
        // come back before that.
        let signed_at = amz_date(date).unwrap();
        let come_back = SystemTime::UNIX_EPOCH
            + Duration::from_secs(u64::try_from(cred.expiration.unix_timestamp()).unwrap());
        assert!(
            come_back <= signed_at + Duration::from_secs(14 * 60),
            "{cred:?}"
        );
    }
}

/// IRSA: AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE, with moto answering the SDK's
/// AssumeRoleWithWebIdentity at AWS_ENDPOINT_URL_STS. The token is signed with the session
/// moto issued (ASIA… key + X-Amz-Security-Token) and names the real regional STS host.
#[test]
fn irsa_web_identity_through_moto() {
    irsa_through_moto(None);
}

/// The same with the arm64 broker and shim under qemu (`credbroker_tests::arch`): its AWS
/// SDK, signing and TLS crypto provider built for arm64, against moto's real STS.
#[test]
fn irsa_web_identity_through_moto_on_arm64() {
    irsa_through_moto(Some(credbroker_tests::arch::arm64()));
}

/// IRSA through moto, with this build's binaries or the arm64 ones.
fn irsa_through_moto(arm64: Option<&credbroker_tests::arch::Arm64>) {
    let moto = Moto::start();
    let dir = tempdir();
    let token_file = dir.path().join("token");
    // A JWT-shaped projected ServiceAccount token (moto does not verify it).
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(br#"{"sub":"system:serviceaccount:kueue-system:kueue-controller-manager","aud":"sts.amazonaws.com"}"#);
    std::fs::write(&token_file, format!("eyJhbGciOiJSUzI1NiJ9.{claims}.c2ln")).expect("token");
    let role = format!("arn:aws:iam::{ACCOUNT}:role/kueue-irsa");
    let broker = aws_broker_of(
        arm64.map(|a| a.wrapper(credbroker_tests::BROKER)),
        &[aws_provider("eks", "")],
        &[
            ("AWS_REGION", "us-west-2".to_owned()),
            ("AWS_ROLE_ARN", role.clone()),
            ("AWS_ROLE_SESSION_NAME", "kueue-irsa-session".to_owned()),
            (
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                token_file.display().to_string(),
            ),
            ("AWS_ENDPOINT_URL_STS", moto.url.clone()),
        ],
    );
    let shim = arm64.map(|a| a.wrapper(credbroker_tests::SHIM));
    let cred = token_for_with(
        shim.as_deref(),
        &broker,
        "https://10.0.0.1",
        json!({"clusterName": "workers-1"}),
    );
    let d = check_shape(&cred.token, "sts.us-west-2.amazonaws.com").expect("a presigned EKS token");
    let key = d
        .get("X-Amz-Credential")
        .and_then(|c| c.split('/').next())
        .unwrap_or_default()
        .to_owned();
    assert!(key.starts_with("ASIA"), "session key expected, got {key}");
    assert!(d.get("X-Amz-Security-Token").is_some_and(|t| !t.is_empty()));
    assert_eq!(
        moto.caller_arn(&d),
        format!("arn:aws:sts::{ACCOUNT}:assumed-role/kueue-irsa/kueue-irsa-session")
    );
    assert_eq!(
        moto.assumed_roles().len(),
        1,
        "one AssumeRoleWithWebIdentity"
    );
    // A second cluster signs with the same held session: no new STS call.
    let other = token_for_with(
        shim.as_deref(),
        &broker,
        "https://10.0.0.2",
        json!({"clusterName": "workers-2"}),
    );
    let d2 =
        check_shape(&other.token, "sts.us-west-2.amazonaws.com").expect("a presigned EKS token");
    assert_eq!(
        d2.get("X-Amz-Credential").map(|c| c.split('/').next()),
        Some(Some(key.as_str()))
    );
    assert_eq!(moto.assumed_roles().len(), 1);
}

/// `roleArn` on the provider: 20 clusters, 100 tokens, one AssumeRole (counted at moto),
/// and every token maps (through moto's GetCallerIdentity) to the assumed role.
#[test]
fn one_assume_role_for_twenty_clusters_and_a_hundred_tokens() {
    let moto = Moto::start();
    let role = format!("arn:aws:iam::{ACCOUNT}:role/kueue");
    let mut env = static_keys(None);
    env.push(("AWS_ENDPOINT_URL_STS", moto.url.clone()));
    let broker = aws_broker(
        &[aws_provider(
            "eks",
            &format!(
                "region: us-west-2, roleArn: {}, sessionName: kueue-mgr",
                yaml_str(&role)
            ),
        )],
        &env,
    );
    let mut keys = std::collections::HashSet::new();
    let mut tokens = 0;
    for round in 0..5 {
        for i in 0..20 {
            let cred = token_for(
                &broker,
                &format!("https://10.0.0.{i}"),
                json!({"clusterName": format!("cluster-{i:02}")}),
            );
            tokens += 1;
            let d = check_shape(&cred.token, "sts.us-west-2.amazonaws.com").unwrap();
            keys.insert(
                d.get("X-Amz-Credential")
                    .unwrap_or_default()
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
            );
            if round == 0 && i % 7 == 0 {
                assert_eq!(
                    moto.caller_arn(&d),
                    format!("arn:aws:sts::{ACCOUNT}:assumed-role/kueue/kueue-mgr")
                );
            }
        }
    }
    assert_eq!(tokens, 100);
    assert_eq!(
        keys.len(),
        1,
        "every token signed with the one session: {keys:?}"
    );
    let roles = moto.assumed_roles();
    assert_eq!(roles.len(), 1, "AssumeRole calls seen by moto: {roles:?}");
}

/// kubectl → shim → broker → token, against a TLS API server for an EKS-shaped cluster that
/// decodes each bearer token and accepts it only if aws-iam-authenticator would pass it on
/// to STS (shape, host for the cluster's region, fresh date, signed x-k8s-aws-id).
#[test]
fn kubectl_reaches_an_eks_shaped_cluster() {
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    let api = FakeHttps::spawn(move |req: &Seen| {
        let token = req
            .headers
            .get("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        match check_shape(token, "sts.eu-north-1.amazonaws.com") {
            Ok(d) if d.get("X-Amz-Credential").is_some_and(|c| c.starts_with(STATIC_KEY)) => {
                count.fetch_add(1, Ordering::SeqCst);
                (200, json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}).to_string())
            }
            Ok(_) | Err(_) => (
                401,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Unauthorized", "code": 401}).to_string(),
            ),
        }
    });
    let broker = aws_broker(
        &[aws_provider("eks", "")],
        &static_keys(Some("kubectl-session")),
    );
    let dir = tempdir();
    let mut first_tokens = Vec::new();
    for (file, cluster, api_version) in [("a.json", "alpha", V1), ("b.json", "beta", V1BETA1)] {
        let kubeconfig = dir.path().join(file);
        write_kubeconfig(
            &kubeconfig,
            &Kubeconfig {
                server: api.url(),
                ca_pem: api.ca_pem(),
                // The ClusterProfile extension: {clusterName, region}.
                cluster_config: json!({"clusterName": cluster, "region": "eu-north-1"}),
                api_version,
                provider: "eks",
                socket: broker.socket(),
            },
        );
        for _ in 0..2 {
            let out = kubectl(&kubeconfig, &["get", "--raw", "/api"]);
            assert!(
                out.status.success(),
                "kubectl failed: {}\nbroker log:\n{}",
                describe(&out),
                broker.logs()
            );
            let body: Value = serde_json::from_slice(&out.stdout).expect("kubectl JSON");
            assert_eq!(body["kind"], "APIVersions");
        }
        let seen = api.seen();
        let last = seen.last().expect("requests");
        first_tokens.push(
            last.headers
                .get("authorization")
                .cloned()
                .unwrap_or_default(),
        );
    }
    assert!(accepted.load(Ordering::SeqCst) >= 4);
    assert!(
        api.seen()
            .iter()
            .all(|r| r.headers.contains_key("authorization"))
    );
    // One token per cluster (the signed x-k8s-aws-id differs), reused across kubectl runs.
    assert_ne!(first_tokens[0], first_tokens[1]);
}

/// Region: cluster key → provider key → EKS server host → AWS_REGION; none → an error that
/// names the cluster.
#[test]
fn region_selection_end_to_end() {
    let broker = aws_broker(
        &[
            aws_provider("eks", ""),
            aws_provider("eks-pinned", "region: ap-northeast-1"),
        ],
        &static_keys(None),
    );
    let eks_server = "https://0123ABCD.gr7.ca-central-1.eks.amazonaws.com";
    let host = |provider: &str, server: &str, config: Value| {
        let info = exec_info(V1, server, config);
        let out = run_shim(broker.socket(), &["--provider", provider], Some(&info));
        let cred = assert_credential(&out, V1);
        decode_token(&cred.token).unwrap().host
    };
    let cluster = json!({"clusterName": "c", "region": "sa-east-1"});
    assert_eq!(
        host("eks-pinned", eks_server, cluster),
        "sts.sa-east-1.amazonaws.com"
    );
    assert_eq!(
        host("eks-pinned", eks_server, json!({"clusterName": "c"})),
        "sts.ap-northeast-1.amazonaws.com"
    );
    assert_eq!(
        host("eks", eks_server, json!({"clusterName": "c"})),
        "sts.ca-central-1.amazonaws.com"
    );
    let out = shim_fails(&broker, "https://10.9.9.9", json!({"clusterName": "gamma"}));
    assert_shim_error(&out, &["no AWS region for cluster gamma", "region"]);

    // With AWS_REGION the SDK default fills in.
    let mut env = static_keys(None);
    env.push(("AWS_REGION", "eu-south-1".to_owned()));
    let broker = aws_broker(&[aws_provider("eks", "")], &env);
    let cred = token_for(&broker, "https://10.9.9.9", json!({"clusterName": "gamma"}));
    assert_eq!(
        decode_token(&cred.token).unwrap().host,
        "sts.eu-south-1.amazonaws.com"
    );
    // The global endpoint on request.
    let broker = aws_broker(
        &[aws_provider(
            "eks",
            "region: us-west-2, stsEndpoint: global",
        )],
        &static_keys(None),
    );
    let cred = token_for(&broker, "https://10.9.9.9", json!({"clusterName": "g"}));
    let d = check_shape(&cred.token, "sts.amazonaws.com").unwrap();
    assert!(
        d.get("X-Amz-Credential")
            .unwrap_or_default()
            .contains("/us-east-1/sts/")
    );
}

/// No credential source at all: UNAVAILABLE, naming every source the chain tried.
#[test]
fn no_credentials_says_which_sources_were_tried() {
    let broker = aws_broker(&[aws_provider("eks", "region: us-west-2")], &[]);
    let out = shim_fails(&broker, "https://10.0.0.1", json!({"clusterName": "alpha"}));
    let line = assert_shim_error(
        &out,
        &[
            "no AWS credentials found",
            "AWS_ACCESS_KEY_ID",
            "AWS_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "IMDSv2",
            "alpha",
        ],
    );
    assert!(!line.contains(STATIC_SECRET));
}

/// The body of every refusal of [`refusing_imds`]: large, and marked, to find it if it
/// reaches a log.
const IMDS_REFUSAL_MARK: &str = "imds-refusal-body";

/// An instance metadata endpoint that refuses everything with 403 and a multi-kilobyte body,
/// as IMDS does when disabled on the instance, and as sandboxes' metadata proxies do.
fn refusing_imds() -> FakeHttps {
    let body = format!(
        "<html><body>{}</body></html>",
        IMDS_REFUSAL_MARK.repeat(400)
    );
    FakeHttps::spawn_plain(move |_req: &Seen| {
        Reply::new(403, body.clone()).header("content-type", "text/html")
    })
}

/// No credentials, and instance metadata refusing (403) rather than absent: the error still
/// lists every source the chain tried, in one line (it named only IMDS, the last), and the
/// SDK's WARN dumps of the raw refusals stay out of the log (they ran to kilobytes).
#[test]
fn refusing_instance_metadata_still_lists_every_source_and_logs_no_dump() {
    let imds = refusing_imds();
    let broker = aws_broker(
        &[aws_provider("eks", "")],
        &[
            ("AWS_EC2_METADATA_DISABLED", "false".to_owned()),
            ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url().to_owned()),
        ],
    );
    let out = shim_fails(
        &broker,
        "https://abc.gr7.us-west-2.eks.amazonaws.com",
        json!({"clusterName": "alpha"}),
    );
    let line = assert_shim_error(
        &out,
        &[
            "UNAVAILABLE",
            "no AWS credentials found",
            "AWS_ACCESS_KEY_ID",
            "AWS_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "IMDSv2",
            "alpha",
        ],
    );
    assert!(!line.contains(IMDS_REFUSAL_MARK), "{line}");
    assert!(
        !imds.seen().is_empty(),
        "the chain reached instance metadata"
    );
    let logs = broker.logs();
    for log_line in logs.lines() {
        assert!(
            log_line.len() < 2048 && !log_line.contains(IMDS_REFUSAL_MARK),
            "a {}-byte log line: {}",
            log_line.len(),
            &log_line[..log_line.len().min(600)]
        );
    }
    assert!(
        logs.contains("no AWS credentials found"),
        "the broker's own line says what failed:\n{logs}"
    );
}

/// A fake STS over TLS (trusted through SSL_CERT_FILE, on top of the system store): AccessDenied
/// on AssumeRole → PERMISSION_DENIED naming the role; the request it got was a correctly
/// signed AssumeRole for that role, session name and external id.
#[tokio::test(flavor = "multi_thread")]
async fn assume_role_denied_is_permission_denied() {
    let role = format!("arn:aws:iam::{ACCOUNT}:role/denied");
    let sts = FakeHttps::spawn(|_req: &Seen| {
        (
            403,
            sts_error(
                "AccessDenied",
                "User: arn:aws:iam::123456789012:user/base is not authorized to perform: sts:AssumeRole",
            ),
        )
    });
    let dir = tempdir();
    let mut env = static_keys(None);
    env.push(("AWS_ENDPOINT_URL_STS", sts.url().to_owned()));
    env.push((
        "SSL_CERT_FILE",
        sts.ca_file(dir.path()).display().to_string(),
    ));
    let broker = aws_broker(
        &[aws_provider(
            "eks",
            &format!(
                "region: us-west-2, roleArn: {}, externalId: ext-1234, sessionName: kueue",
                yaml_str(&role)
            ),
        )],
        &env,
    );
    let status = get_token(broker.socket(), "eks", cluster_with_name("alpha"))
        .await
        .expect_err("denied");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains(&role), "{}", status.message());
    assert!(
        status.message().contains("AccessDenied"),
        "{}",
        status.message()
    );
    assert!(
        !status.message().contains("ext-1234"),
        "{}",
        status.message()
    );
    assert!(!broker.logs().contains(STATIC_SECRET));

    let seen = sts.seen();
    assert_eq!(seen.len(), 1, "a denial is not retried: {seen:?}");
    let fields = seen[0].form();
    assert_eq!(fields.get("Action").map(String::as_str), Some("AssumeRole"));
    assert_eq!(fields.get("RoleArn"), Some(&role));
    assert_eq!(
        fields.get("RoleSessionName").map(String::as_str),
        Some("kueue")
    );
    assert_eq!(
        fields.get("ExternalId").map(String::as_str),
        Some("ext-1234")
    );
    assert!(seen[0].headers["authorization"].contains(&format!("Credential={STATIC_KEY}/")));
    assert_signed_with_static_key(&seen, sts.url());
}

/// Throttling and 5xx on renewal: the SDK retries with backoff, the broker backs off, and
/// the cached token is served meanwhile; once STS recovers a new token is served.
#[test]
fn throttling_and_5xx_are_retried_while_the_cached_token_is_served() {
    /// Short sessions make the broker renew within seconds (a token never outlives its
    /// session, and the cache refreshes at about half the token's life).
    const SESSION: Duration = Duration::from_secs(50);
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let (f, c, e) = (
        Arc::clone(&failing),
        Arc::clone(&calls),
        Arc::clone(&failures),
    );
    let sts = FakeHttps::spawn(move |_req: &Seen| {
        let n = c.fetch_add(1, Ordering::SeqCst) + 1;
        if f.load(Ordering::SeqCst) {
            let k = e.fetch_add(1, Ordering::SeqCst);
            if k % 2 == 0 {
                (400, sts_error("Throttling", "Rate exceeded"))
            } else {
                (503, sts_error("ServiceUnavailable", "try again"))
            }
        } else {
            (200, assume_role_ok(n, SESSION))
        }
    });
    let dir = tempdir();
    let mut env = static_keys(None);
    env.push(("AWS_ENDPOINT_URL_STS", sts.url().to_owned()));
    env.push((
        "SSL_CERT_FILE",
        sts.ca_file(dir.path()).display().to_string(),
    ));
    let role = format!("arn:aws:iam::{ACCOUNT}:role/kueue");
    let broker = aws_broker(
        &[aws_provider(
            "eks",
            &format!("region: us-west-2, roleArn: {}", yaml_str(&role)),
        )],
        &env,
    );
    let cluster = json!({"clusterName": "alpha"});
    let first = token_for(&broker, "https://10.0.0.1", cluster.clone());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The token lives no longer than its 24 s session.
    let remaining = first.expiration - time::OffsetDateTime::now_utc();
    assert!(remaining <= time::Duration::seconds(51), "{remaining}");

    failing.store(true, Ordering::SeqCst);
    // The broker re-signs the token with the held session (no STS call) until that session
    // is half spent, then renews it: STS now fails (the SDK retries with backoff, then the
    // broker backs off), and every call is still answered with a token of the first session
    // until it nearly expires. Asked over gRPC: the shim's whole-second expiry check is not
    // what this test is about.
    let first_key = key_of(&first.token);
    let deadline = Instant::now() + SESSION - Duration::from_secs(2);
    while failures.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "no failing renewals seen; broker log:\n{}",
            broker.logs()
        );
        let again = grpc_token(broker.socket(), "alpha")
            .unwrap_or_else(|s| panic!("{s:?}; broker log:\n{}", broker.logs()));
        assert_eq!(
            key_of(&again),
            first_key,
            "served from the first session during the outage"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let failed_calls = calls.load(Ordering::SeqCst) - 1;
    failing.store(false, Ordering::SeqCst);
    let renewed = wait_until(Duration::from_secs(30), || {
        grpc_token(broker.socket(), "alpha").is_ok_and(|t| key_of(&t) != first_key)
    });
    assert!(
        renewed,
        "no token of a new session after STS recovered; log:\n{}",
        broker.logs()
    );
    assert!(failed_calls >= 2, "{failed_calls}");
    let requests = sts.seen();
    assert!(
        requests
            .iter()
            .all(|r| r.form().get("Action").map(String::as_str) == Some("AssumeRole"))
    );
    assert_signed_with_static_key(&requests, sts.url());
}

/// The access key a token was signed with.
fn key_of(token: &str) -> String {
    let d = decode_token(token).expect("token");
    let credential = d.get("X-Amz-Credential").expect("credential");
    credential.split('/').next().unwrap_or_default().to_owned()
}

/// One GetToken over gRPC for cluster `name` of provider `eks`: the token.
fn grpc_token(socket: &Path, name: &str) -> Result<String, tonic::Status> {
    get_token_blocking(socket, "eks", cluster_with_name(name)).map(|r| r.token)
}

fn cluster_with_name(name: &str) -> Cluster {
    cluster("https://10.0.0.1", &json!({"clusterName": name}))
}

/// The whole IRSA flow at `RUST_LOG=trace` (the SDK's own trace output included): no token,
/// session token, secret key or web identity token in any log line.
#[test]
fn trace_logs_hold_no_secret() {
    // Asking for the signer's trace explicitly does not lift the cap either.
    for rust_log in ["trace", "trace,aws_sigv4=trace"] {
        irsa_flow_logs_no_secret(rust_log);
    }
}

fn irsa_flow_logs_no_secret(rust_log: &str) {
    let moto = Moto::start();
    let dir = tempdir();
    let token_file = dir.path().join("token");
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(br#"{"sub":"system:serviceaccount:kueue-system:trace","aud":"sts.amazonaws.com"}"#);
    let web_identity = format!("eyJhbGciOiJSUzI1NiJ9.{claims}.c2ln");
    std::fs::write(&token_file, &web_identity).expect("token");
    let broker = aws_broker(
        &[aws_provider("eks", "")],
        &[
            ("RUST_LOG", rust_log.to_owned()),
            ("AWS_REGION", "us-west-2".to_owned()),
            (
                "AWS_ROLE_ARN",
                format!("arn:aws:iam::{ACCOUNT}:role/kueue-trace"),
            ),
            (
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                token_file.display().to_string(),
            ),
            ("AWS_ENDPOINT_URL_STS", moto.url.clone()),
        ],
    );
    let cred = token_for(
        &broker,
        "https://10.0.0.1",
        json!({"clusterName": "trace-1"}),
    );
    let d = check_shape(&cred.token, "sts.us-west-2.amazonaws.com").expect("an EKS-shaped token");
    let session = d.get("X-Amz-Security-Token").unwrap_or_default().to_owned();
    let signature = d.get("X-Amz-Signature").unwrap_or_default().to_owned();
    assert!(!session.is_empty() && !signature.is_empty());
    let logs = broker.logs();
    assert!(logs.lines().count() > 20, "trace logging is on:\n{logs}");
    for (what, secret) in [
        ("token", cred.token.as_str()),
        ("session token", session.as_str()),
        // Also as it would appear percent-encoded: its first characters are plain.
        ("session token prefix", &session[..20.min(session.len())]),
        ("signature", signature.as_str()),
        ("web identity token", web_identity.as_str()),
        ("secret key field", "SecretAccessKey"),
    ] {
        assert!(
            !logs.contains(secret),
            "the {what} is in the trace log:\n{logs}"
        );
    }
}
