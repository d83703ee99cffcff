//! `type: kubernetesSecret` end to end: the broker watches Secrets on a fake Kubernetes API
//! server over TLS (reached through a kubeconfig file with the fake's CA and a bearer
//! token), and the shim — and kubectl through it — gets each cluster's credential.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use credbroker_proto::v1::ListProvidersRequest;
use credbroker_proto::v1::admin_service_client::AdminServiceClient;
use credbroker_tests::fakes::kube_api::{FakeKubeApi, KubeCall};
use credbroker_tests::{
    Broker, FakeApiServer, Kubeconfig, V1, assert_credential, assert_shim_error, config_yaml,
    describe, exec_info, kubectl, run_shim, tempdir, unix_channel, wait_until, write_kubeconfig,
    yaml_str,
};
use serde_json::{Value, json};

const NAMESPACE: &str = "kueue-system";
/// The broker's own credential for the (fake) hub API server.
const HUB_TOKEN: &str = "hub-token-for-the-broker";
/// The label every credential Secret of these tests carries, and the provider's required
/// `labelSelector` for it.
const LABEL: (&str, &str) = ("credbroker.dev/credential", "true");
const SELECTOR: &str = "credbroker.dev/credential=true";
/// Bound on waiting for a change to travel through the watch.
const WATCH_WAIT: Duration = Duration::from_secs(15);

/// A fake hub, a kubeconfig for it, and a broker with one kubernetesSecret provider
/// named `secrets` configured with `extra` (YAML flow-mapping entries).
struct Hub {
    api: FakeKubeApi,
    broker: Broker,
    _dir: tempfile::TempDir,
}

fn hub_with(api: FakeKubeApi, extra: &str) -> Hub {
    hub_env(api, extra, &[("RUST_LOG", "info")])
}

/// Like [`hub_with`], with extra environment for the broker.
fn hub_env(api: FakeKubeApi, extra: &str, env: &[(&str, &str)]) -> Hub {
    hub_allowing(api, extra, "{}", env)
}

/// Like [`hub_env`], with the provider's `allowOverrides` (a flow mapping).
fn hub_allowing(api: FakeKubeApi, extra: &str, allow: &str, env: &[(&str, &str)]) -> Hub {
    let dir = tempdir();
    let kubeconfig: PathBuf = dir.path().join("hub.kubeconfig");
    api.write_kubeconfig(&kubeconfig, HUB_TOKEN);
    let mut extra = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    if !extra.contains("labelSelector") {
        extra.push_str(&format!(", labelSelector: {SELECTOR}"));
    }
    let provider = format!(
        "  - name: secrets\n    type: kubernetesSecret\n    allowOverrides: {allow}\n    kubernetesSecret: {{namespace: {NAMESPACE}, kubeconfig: {}{extra}}}\n",
        yaml_str(kubeconfig.to_str().expect("UTF-8 path"))
    );
    let broker = Broker::start_with(&config_yaml(&[provider]), &[], env);
    Hub {
        api,
        broker,
        _dir: dir,
    }
}

impl Hub {
    fn shim(&self, config: Value) -> Output {
        let info = exec_info(V1, "https://worker.example", config);
        run_shim(
            self.broker.socket(),
            &["--provider", "secrets"],
            Some(&info),
        )
    }

    fn token(&self, cluster: &str) -> String {
        let out = self.shim(json!({"clusterName": cluster}));
        assert!(
            out.status.success(),
            "shim for {cluster}: {}\nbroker log:\n{}",
            describe(&out),
            self.broker.logs()
        );
        assert_credential(&out, V1).token
    }

    /// Waits (bounded) until the shim hands out `want` for `cluster`.
    fn wait_for_token(&self, cluster: &str, want: &str) {
        let mut last = String::new();
        let seen = wait_until(WATCH_WAIT, || {
            let out = self.shim(json!({"clusterName": cluster}));
            last = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            out.status.success() && assert_credential(&out, V1).token == want
        });
        assert!(
            seen,
            "the shim never handed out {want:?} for {cluster}; last answer: {last}\nbroker log:\n{}",
            self.broker.logs()
        );
    }

    /// `ready` of the provider in AdminService's ListProviders.
    fn ready(&self) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut client = AdminServiceClient::new(unix_channel(self.broker.socket()).await);
            let providers = client
                .list_providers(ListProvidersRequest {})
                .await
                .expect("ListProviders")
                .into_inner()
                .providers;
            providers
                .iter()
                .find(|p| p.name == "secrets")
                .expect("provider listed")
                .ready
        })
    }

    fn wait_ready(&self, want: bool) {
        assert!(
            wait_until(WATCH_WAIT, || self.ready() == want),
            "ListProviders never showed ready = {want}; broker log:\n{}",
            self.broker.logs()
        );
    }
}

/// Every request reached the namespace's Secrets with the broker's bearer token.
fn assert_requests_are_right(api: &FakeKubeApi, selector: Option<&str>) {
    let requests = api.requests();
    assert!(!requests.is_empty());
    for r in &requests {
        assert_eq!(
            r.path,
            format!("/api/v1/namespaces/{NAMESPACE}/secrets"),
            "{r:?}"
        );
        assert_eq!(r.token.as_deref(), Some(HUB_TOKEN), "{r:?}");
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(
            r.query.get("labelSelector").map(String::as_str),
            selector,
            "{r:?}"
        );
    }
    // Watches resume from a resourceVersion and ask for bookmarks.
    for r in requests.iter().filter(|r| r.call == KubeCall::Watch) {
        assert!(r.query.contains_key("resourceVersion"), "{r:?}");
        assert_eq!(
            r.query.get("allowWatchBookmarks").map(String::as_str),
            Some("true")
        );
    }
}

#[test]
fn token_format_and_rotation_through_the_watch() {
    let api = FakeKubeApi::start(NAMESPACE, HUB_TOKEN);
    api.put_secret("alpha", &[("app", "kueue")], &[("token", b"tok-alpha-1")]);
    api.put_secret("beta", &[("app", "kueue")], &[("token", b"tok-beta-1\n")]);
    api.put_secret("gamma", &[("app", "other")], &[("token", b"tok-gamma-1")]);
    let hub = hub_with(api, "labelSelector: app=kueue");

    assert_eq!(hub.token("alpha"), "tok-alpha-1");
    assert_eq!(hub.token("beta"), "tok-beta-1");
    // Outside the label selector: not served.
    let out = hub.shim(json!({"clusterName": "gamma"}));
    assert_shim_error(
        &out,
        &[
            "NOT_FOUND",
            "Secret kueue-system/gamma does not exist or does not match labelSelector",
        ],
    );

    // Rotation: picked up through the watch, without another list.
    hub.api
        .put_secret("alpha", &[("app", "kueue")], &[("token", b"tok-alpha-2")]);
    hub.wait_for_token("alpha", "tok-alpha-2");
    assert_eq!(hub.token("beta"), "tok-beta-1");
    assert_eq!(hub.api.count(KubeCall::List), 1, "{:?}", hub.api.requests());
    assert!(hub.api.count(KubeCall::Watch) >= 1);
    assert_requests_are_right(&hub.api, Some("app=kueue"));
    assert!(hub.ready());
}

/// Item 2 of issue 23: a Secret of the watched namespace that the selector does not select
/// (here Kueue's webhook certificate, which lives in kueue-system) never reaches the broker:
/// every list and watch carries the selector, so the API server never sends it, changes to it
/// never arrive, and asking for it by name is NOT_FOUND. The broker cannot hold what it was
/// never sent; the fake records every Secret it sent.
#[test]
fn an_unrelated_secret_in_the_namespace_is_never_listed_watched_or_held() {
    let api = FakeKubeApi::start(NAMESPACE, HUB_TOKEN);
    let webhook = "kueue-webhook-server-cert";
    api.put_secret(
        webhook,
        &[("app.kubernetes.io/name", "kueue")],
        &[
            ("token", b"not-a-worker-token"),
            ("tls.key", b"webhook-private-key"),
        ],
    );
    api.put_secret("alpha", &[LABEL], &[("token", b"tok-alpha-1")]);
    let hub = hub_with(api, "");
    assert_eq!(hub.token("alpha"), "tok-alpha-1");

    // Changes while the watch runs: the credential's arrives, the webhook Secret's does not.
    hub.api.put_secret(
        webhook,
        &[("app.kubernetes.io/name", "kueue")],
        &[("token", b"not-a-worker-token-2")],
    );
    hub.api
        .put_secret("alpha", &[LABEL], &[("token", b"tok-alpha-2")]);
    hub.wait_for_token("alpha", "tok-alpha-2");
    assert_shim_error(
        &hub.shim(json!({"clusterName": webhook})),
        &[
            "NOT_FOUND",
            &format!(
                "Secret kueue-system/{webhook} does not exist or does not match labelSelector"
            ),
        ],
    );

    assert_requests_are_right(&hub.api, Some(SELECTOR));
    assert_eq!(
        hub.api.sent_names().into_iter().collect::<Vec<_>>(),
        ["alpha"],
        "the API server sent the broker only the selected Secret"
    );
    assert!(!hub.broker.logs().contains("not-a-worker-token"));
}

/// A provider without a labelSelector would hold every Secret of the namespace: refused at
/// start and by check-config, naming the key and why.
#[test]
fn a_provider_without_a_label_selector_is_refused() {
    let dir = tempdir();
    let file = dir.path().join("credbroker.yaml");
    std::fs::write(
        &file,
        format!(
            "providers:\n  - name: secrets\n    type: kubernetesSecret\n    kubernetesSecret: {{namespace: {NAMESPACE}}}\n"
        ),
    )
    .expect("write config");
    let out = credbroker_tests::run_broker_cli(&["check-config".as_ref(), file.as_os_str()]);
    assert!(!out.status.success(), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for want in [
        "providers[0].kubernetesSecret.labelSelector: required",
        "never the rest of namespace \"kueue-system\"",
        "labelSelector: credbroker.dev/credential=true",
    ] {
        assert!(stderr.contains(want), "{want:?} in {stderr}");
    }
}

#[test]
fn ocm_names_deletion_and_missing_key() {
    let api = FakeKubeApi::start(NAMESPACE, HUB_TOKEN);
    api.put_secret("alpha-kueue", &[LABEL], &[("token", b"tok-alpha-msa")]);
    api.put_secret("beta-kueue", &[LABEL], &[("ca.crt", b"not a token")]);
    let hub = hub_with(
        api,
        r#"nameTemplate: "{clusterName}-{msaName}", templateDefaults: {msaName: kueue}"#,
    );
    assert_eq!(hub.token("alpha"), "tok-alpha-msa");

    let out = hub.shim(json!({"clusterName": "beta"}));
    assert_shim_error(
        &out,
        &[
            "NOT_FOUND",
            "Secret kueue-system/beta-kueue has no key \"token\" (its keys: ca.crt)",
        ],
    );

    hub.api.delete_secret("alpha-kueue");
    let mut last = None;
    let gone = wait_until(WATCH_WAIT, || {
        let out = hub.shim(json!({"clusterName": "alpha"}));
        let failed = !out.status.success();
        last = Some(out);
        failed
    });
    let last = last.expect("one shim run");
    assert!(
        gone,
        "a deleted Secret was still served: {}",
        describe(&last)
    );
    assert_shim_error(
        &last,
        &[
            "NOT_FOUND",
            "provider \"secrets\"",
            "Secret kueue-system/alpha-kueue does not exist",
        ],
    );
    assert_eq!(hub.api.count(KubeCall::List), 1);
    assert_requests_are_right(&hub.api, Some(SELECTOR));
}

fn kubeconfig_secret(user: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "w", "cluster": {"server": "https://worker.example"}}],
        "contexts": [
            {"name": "admin", "context": {"cluster": "w", "user": "admin"}},
            {"name": "viewer", "context": {"cluster": "w", "user": "viewer"}},
        ],
        "current-context": "admin",
        "users": [
            {"name": "admin", "user": user},
            {"name": "viewer", "user": {"token": "tok-viewer"}},
        ],
    }))
    .expect("JSON")
}

#[test]
fn kubeconfig_format_with_a_token_and_with_a_client_certificate() {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    // A client certificate that expires on 2099-01-01.
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.not_after = rcgen::date_time_ymd(2099, 1, 1);
    let cert = params.self_signed(&key).expect("cert");
    let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());

    let api = FakeKubeApi::start(NAMESPACE, HUB_TOKEN);
    api.put_secret(
        "tokened",
        &[LABEL],
        &[(
            "kubeconfig",
            &kubeconfig_secret(json!({"token": "tok-admin"})),
        )],
    );
    api.put_secret(
        "certified",
        &[LABEL],
        &[(
            "kubeconfig",
            &kubeconfig_secret(json!({
                "client-certificate-data": b64(&cert_pem),
                "client-key-data": b64(&key_pem),
            })),
        )],
    );
    api.put_secret(
        "plugged",
        &[LABEL],
        &[(
            "kubeconfig",
            &kubeconfig_secret(json!({"exec": {"apiVersion": V1, "command": "/bin/aws"}})),
        )],
    );
    api.put_secret(
        "broken",
        &[LABEL],
        &[("kubeconfig", b"users: [ {token: nope")],
    );
    let hub = hub_allowing(
        api,
        "format: kubeconfig, key: kubeconfig",
        "{context: [viewer]}",
        &[("RUST_LOG", "info")],
    );

    assert_eq!(hub.token("tokened"), "tok-admin");
    // The cluster's exec config may name another context, when allowOverrides lets it.
    let out = hub.shim(json!({"clusterName": "tokened", "context": "viewer"}));
    assert_eq!(assert_credential(&out, V1).token, "tok-viewer");

    let out = hub.shim(json!({"clusterName": "certified"}));
    assert!(out.status.success(), "{}", describe(&out));
    let cred: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(cred["status"]["clientCertificateData"], cert_pem.as_str());
    assert_eq!(cred["status"]["clientKeyData"], key_pem.as_str());
    assert!(cred["status"].get("token").is_none(), "{cred}");
    // Come back long before the certificate's notAfter (decades away): the cache schedules
    // any credential as living at most MAX_LIFETIME (24 h), so within a day, and later than a
    // 1h lifetime would.
    let expiry = cred["status"]["expirationTimestamp"]
        .as_str()
        .expect("expiry");
    let expiry =
        time::OffsetDateTime::parse(expiry, &time::format_description::well_known::Rfc3339)
            .expect("RFC 3339");
    assert!(expiry.year() < 2099, "{expiry}");
    let now = time::OffsetDateTime::now_utc();
    assert!(expiry > now + time::Duration::hours(2), "{expiry}");
    assert!(expiry <= now + time::Duration::hours(24), "{expiry}");

    let out = hub.shim(json!({"clusterName": "plugged"}));
    assert_shim_error(
        &out,
        &[
            "key \"kubeconfig\" of Secret kueue-system/plugged",
            "runs an exec plugin",
        ],
    );
    let out = hub.shim(json!({"clusterName": "broken"}));
    let line = assert_shim_error(&out, &["not a valid kubeconfig: YAML syntax error at line"]);
    assert!(!line.contains("nope"), "{line}");
}

#[test]
fn api_server_restart_serves_the_store_and_the_watch_resumes() {
    let api = FakeKubeApi::start(NAMESPACE, HUB_TOKEN);
    api.put_secret("alpha", &[LABEL], &[("token", b"tok-alpha-1")]);
    api.put_secret("beta", &[LABEL], &[("token", b"tok-beta-1")]);
    let hub = hub_with(api, "");
    assert_eq!(hub.token("alpha"), "tok-alpha-1");
    hub.wait_ready(true);

    hub.api.stop();
    hub.wait_ready(false);
    // While the API server is away: a cluster never asked for is served from the store.
    assert_eq!(hub.token("beta"), "tok-beta-1");
    assert_eq!(hub.token("alpha"), "tok-alpha-1");
    let logs = hub.broker.logs();
    assert!(
        logs.contains("the watch on Secrets failed; serving the last state seen")
            && logs.contains("serving a Secret from the last state seen"),
        "{logs}"
    );

    hub.api.restart();
    hub.wait_ready(true);
    hub.api
        .put_secret("alpha", &[LABEL], &[("token", b"tok-alpha-2")]);
    hub.wait_for_token("alpha", "tok-alpha-2");
    // The watch resumed from its resourceVersion: still the one list.
    assert_eq!(hub.api.count(KubeCall::List), 1, "{:?}", hub.api.requests());
    assert!(hub.api.count(KubeCall::Watch) >= 2);
    assert_requests_are_right(&hub.api, Some(SELECTOR));
    let logs = hub.broker.logs();
    assert!(
        !logs.contains("tok-alpha"),
        "a token reached the log:\n{logs}"
    );
}

/// A broker whose `secrets` provider has no `kubeconfig` key, with `env`.
fn broker_without_kubeconfig_key(env: &[(&str, &str)]) -> Broker {
    let provider = format!(
        "  - name: secrets\n    type: kubernetesSecret\n    kubernetesSecret: {{namespace: {NAMESPACE}, labelSelector: {SELECTOR}}}\n"
    );
    Broker::start_with(&config_yaml(&[provider]), &[], env)
}

/// Where the broker's own API client comes from, in every Kubernetes client's order:
/// `kubernetesSecret.kubeconfig`, then `KUBECONFIG`, then in-cluster. Outside a pod, with
/// KUBECONFIG set and no key, it used to fail with "no in-cluster configuration".
#[test]
fn api_client_from_the_key_then_kubeconfig_env_then_in_cluster() {
    let api = FakeKubeApi::start(NAMESPACE, HUB_TOKEN);
    api.put_secret("alpha", &[LABEL], &[("token", b"tok-alpha")]);
    let dir = tempdir();
    let kubeconfig = dir.path().join("hub.kubeconfig");
    api.write_kubeconfig(&kubeconfig, HUB_TOKEN);
    let kubeconfig = kubeconfig.to_str().expect("UTF-8 path");
    let not_in_a_pod = ("KUBERNETES_SERVICE_HOST", "");
    let alpha = exec_info(
        V1,
        "https://worker.example",
        json!({"clusterName": "alpha"}),
    );
    let shim =
        |broker: &Broker| run_shim(broker.socket(), &["--provider", "secrets"], Some(&alpha));

    // KUBECONFIG, outside a pod, no key: the API server it names is watched.
    let broker = broker_without_kubeconfig_key(&[("KUBECONFIG", kubeconfig), not_in_a_pod]);
    let out = shim(&broker);
    assert!(
        out.status.success(),
        "{}\nbroker log:\n{}",
        describe(&out),
        broker.logs()
    );
    assert_eq!(assert_credential(&out, V1).token, "tok-alpha");
    drop(broker);

    // A KUBECONFIG list whose first file is missing fails naming KUBECONFIG (never falls
    // through to in-cluster).
    let missing = dir.path().join("missing.kubeconfig");
    let list = format!("{}:{kubeconfig}", missing.display());
    let broker = broker_without_kubeconfig_key(&[("KUBECONFIG", &list), not_in_a_pod]);
    let line = assert_shim_error(
        &shim(&broker),
        &["UNAVAILABLE", "KUBECONFIG", "missing.kubeconfig"],
    );
    assert!(!line.contains("in-cluster"), "{line}");
    drop(broker);

    // The key wins over KUBECONFIG.
    let provider = format!(
        "  - name: secrets\n    type: kubernetesSecret\n    kubernetesSecret: {{namespace: {NAMESPACE}, labelSelector: {SELECTOR}, kubeconfig: {}}}\n",
        yaml_str(kubeconfig)
    );
    let broker = Broker::start_with(
        &config_yaml(&[provider]),
        &[],
        &[
            ("KUBECONFIG", missing.to_str().expect("UTF-8")),
            not_in_a_pod,
        ],
    );
    assert_eq!(assert_credential(&shim(&broker), V1).token, "tok-alpha");
    drop(broker);

    // Neither (an empty KUBECONFIG counts as unset): in-cluster, which outside a pod says
    // what to set.
    let broker = broker_without_kubeconfig_key(&[("KUBECONFIG", ""), not_in_a_pod]);
    assert_shim_error(
        &shim(&broker),
        &[
            "UNAVAILABLE",
            "no in-cluster configuration",
            "kubernetesSecret.kubeconfig",
            "KUBECONFIG",
        ],
    );
}

#[test]
fn unreachable_api_server_is_unavailable_and_not_ready() {
    let api = FakeKubeApi::start(NAMESPACE, HUB_TOKEN);
    api.stop();
    let hub = hub_with(api, "");
    let out = hub.shim(json!({"clusterName": "alpha"}));
    let line = assert_shim_error(
        &out,
        &[
            "UNAVAILABLE",
            "cannot list the Secrets of namespace kueue-system",
        ],
    );
    assert!(line.contains("Connection refused"), "{line}");
    assert!(!hub.ready());
}

#[test]
fn wrong_hub_credential_is_unavailable_with_the_api_servers_answer() {
    let api = FakeKubeApi::start(NAMESPACE, "some-other-token");
    let hub = hub_with(api, "");
    let out = hub.shim(json!({"clusterName": "alpha"}));
    let line = assert_shim_error(&out, &["UNAVAILABLE", "Unauthorized"]);
    assert!(!line.contains(HUB_TOKEN), "{line}");
}

#[test]
fn kubectl_gets_each_clusters_token_from_its_secret() {
    let api = FakeKubeApi::start(NAMESPACE, HUB_TOKEN);
    api.put_secret("alpha", &[LABEL], &[("token", b"tok-alpha-secret")]);
    api.put_secret("beta", &[LABEL], &[("token", b"tok-beta-secret")]);
    let hub = hub_with(api, "");
    let alpha = FakeApiServer::start(&["tok-alpha-secret"]);
    let beta = FakeApiServer::start(&["tok-beta-secret"]);
    let dir = tempdir();
    for (name, server) in [("alpha", &alpha), ("beta", &beta)] {
        let path = dir.path().join(format!("{name}.json"));
        write_kubeconfig(
            &path,
            &Kubeconfig {
                server: server.url(),
                ca_pem: server.ca_pem(),
                cluster_config: json!({"clusterName": name}),
                api_version: V1,
                provider: "secrets",
                socket: hub.broker.socket(),
            },
        );
        for _ in 0..2 {
            let out = kubectl(&path, &["get", "--raw", "/api"]);
            assert!(
                out.status.success(),
                "kubectl for {name}: {}\nbroker log:\n{}",
                describe(&out),
                hub.broker.logs()
            );
        }
    }
    let api_tokens = |s: &FakeApiServer| -> Vec<String> {
        s.requests()
            .into_iter()
            .filter(|r| r.path == "/api")
            .filter_map(|r| r.token)
            .collect()
    };
    assert_eq!(api_tokens(&alpha), vec!["tok-alpha-secret"; 2]);
    assert_eq!(api_tokens(&beta), vec!["tok-beta-secret"; 2]);
    assert_eq!(hub.api.count(KubeCall::List), 1);
}

/// List, watch and a rotation at `RUST_LOG=trace` (kube-rs and hyper included): neither the
/// Secrets' tokens nor the broker's own hub credential appears in any log line.
#[test]
fn trace_logs_hold_no_secret() {
    let api = FakeKubeApi::start(NAMESPACE, HUB_TOKEN);
    api.put_secret("alpha", &[LABEL], &[("token", b"secret-trace-token-1")]);
    let hub = hub_env(api, "", &[("RUST_LOG", "trace")]);
    assert_eq!(hub.token("alpha"), "secret-trace-token-1");
    hub.api
        .put_secret("alpha", &[LABEL], &[("token", b"secret-trace-token-2")]);
    hub.wait_for_token("alpha", "secret-trace-token-2");
    let logs = hub.broker.logs();
    assert!(logs.lines().count() > 20, "trace logging is on:\n{logs}");
    for secret in ["secret-trace-token-1", "secret-trace-token-2", HUB_TOKEN] {
        assert!(
            !logs.contains(secret),
            "{secret} is in the trace log:\n{logs}"
        );
    }
    // Base64 as the API server sends Secret data.
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode("secret-trace-token-2");
    assert!(
        !logs.contains(&encoded),
        "the base64 token is in the trace log:\n{logs}"
    );
}

/// HTTPS_PROXY from the environment is used for the hub, and NO_PROXY exempts it (kube
/// alone would ignore NO_PROXY). The proxy here is a dead port: only a bypass can work.
#[test]
fn https_proxy_and_no_proxy_from_the_environment() {
    let dead_proxy = "http://127.0.0.1:9";
    let api = FakeKubeApi::start(NAMESPACE, HUB_TOKEN);
    api.put_secret("alpha", &[LABEL], &[("token", b"tok-through-no-proxy")]);
    let bypassed = hub_env(
        api,
        "",
        &[
            ("HTTPS_PROXY", dead_proxy),
            ("NO_PROXY", "localhost,127.0.0.1"),
        ],
    );
    assert_eq!(bypassed.token("alpha"), "tok-through-no-proxy");

    let api = FakeKubeApi::start(NAMESPACE, HUB_TOKEN);
    api.put_secret("alpha", &[LABEL], &[("token", b"tok-never-reached")]);
    let proxied = hub_env(api, "", &[("HTTPS_PROXY", dead_proxy), ("NO_PROXY", "")]);
    let out = proxied.shim(json!({"clusterName": "alpha"}));
    assert_shim_error(&out, &["UNAVAILABLE"]);
    assert_eq!(
        proxied.api.requests().len(),
        0,
        "every request went to the (dead) proxy"
    );
}
