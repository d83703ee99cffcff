use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use kube::api::ObjectMeta;

use super::*;
use crate::config::{Config, ProviderSpec};
use crate::providers::ProviderTestExt as _;
use crate::request::ClusterInfo;

/// A throwaway self-signed EC certificate made for these tests (CN kueue-admin), valid
/// until 2100-11-02T12:53:58Z, and its key.
const CERT_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBKDCBzwIUEHj9zV9RCA5duOk3QdpRlJLBAe0wCgYIKoZIzj0EAwIwFjEUMBIG
A1UEAwwLa3VldWUtYWRtaW4wIBcNMjYxMTMwMTI1MzU4WhgPMjEwMDExMDIxMjUz
NThaMBYxFDASBgNVBAMMC2t1ZXVlLWFkbWluMFkwEwYHKoZIzj0CAQYIKoZIzj0D
AQcDQgAE03UyrET16ujoVw3CjnWA4T83vO35IwDa92hboyljn4s2DhtonN598lXf
mEVtRqfjt0JtFm8Ucd4Vx7HBqSDVvDAKBggqhkjOPQQDAgNIADBFAiAjzGYqvlT9
yog4/AEnKmP1vCUuNP+8yzci4QZ5yjdGWwIhAO0SWSC+mXFkC+qR1sLqTOAm3tSz
1bK7H//5WpJ9rJar
-----END CERTIFICATE-----
";
const CERT_NOT_AFTER: u64 = 4_128_843_238;
const KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQggrefA/0YU4HSuf6U
Y5G2Siuk083Mg7f2X5ZHIlnT1UWhRANCAATTdTKsRPXq6OhXDcKOdYDhPze87fkj
ANr3aFujKWOfizYOG2ic3n3yVd+YRW1Gp+O3Qm0WbxRx3hXHscGpINW8
-----END PRIVATE KEY-----
";
const HOUR: Duration = Duration::from_secs(3600);

/// The section `yaml_section` (a flow mapping) with the required labelSelector added.
fn config(yaml_section: &str) -> KubernetesSecretConfig {
    let yaml_section = if yaml_section.contains("labelSelector") {
        yaml_section.to_owned()
    } else {
        yaml_section.replacen('{', "{labelSelector: app=kueue, ", 1)
    };
    let text = format!(
        "providers:\n  - name: s\n    type: kubernetesSecret\n    kubernetesSecret: {yaml_section}\n"
    );
    match Config::parse(&text, "t").unwrap().providers.remove(0).spec {
        ProviderSpec::KubernetesSecret(section) => section,
        other => panic!("{other:?}"),
    }
}

fn req(config: serde_json::Value) -> TokenRequest {
    TokenRequest {
        provider: "s".into(),
        cluster: Some(ClusterInfo {
            config: config.as_object().cloned().unwrap_or_default().into(),
            ..Default::default()
        }),
        interactive: false,
    }
}

fn jwt(exp: u64) -> String {
    crate::providers::jwt::unsigned(&serde_json::json!({"sub": "x", "exp": exp}))
}

fn token_of(c: &Credential) -> &str {
    match &c.secret {
        CredentialSecret::Token(t) => t.expose(),
        CredentialSecret::ClientCertificate { .. } => "",
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

// --- templates -------------------------------------------------------------------------

#[test]
fn default_template_is_the_cluster_name() {
    let p = KubernetesSecretProvider::new("s", config("{namespace: kueue-system}"));
    let t = p.target(&req(json!({"clusterName": "alpha"}))).unwrap();
    assert_eq!(
        t,
        Target {
            name: "alpha".into(),
            key: "token".into(),
            context: None
        }
    );
    assert_eq!(
        p.key_for(&req(json!({"clusterName": "alpha"}))).unwrap(),
        "kueue-system/alpha key token"
    );
    let e = p.target(&req(json!({}))).unwrap_err();
    assert!(
        matches!(&e, ProviderError::InvalidRequest(m) if m.contains("has no clusterName")),
        "{e}"
    );
}

#[test]
fn ocm_template_takes_defaults_and_cluster_overrides() {
    let p = KubernetesSecretProvider::new(
        "s",
        config(
            "{namespace: kueue-system, nameTemplate: \"{clusterName}-{msaName}\", templateDefaults: {msaName: kueue}}",
        ),
    );
    assert_eq!(
        p.target(&req(json!({"clusterName": "c1"}))).unwrap().name,
        "c1-kueue"
    );
    // A key in the cluster's exec config overrides the provider's default.
    assert_eq!(
        p.target(&req(json!({"clusterName": "c1", "msaName": "other"})))
            .unwrap()
            .name,
        "c1-other"
    );
    let p = KubernetesSecretProvider::new(
        "s",
        config("{namespace: n, nameTemplate: \"{clusterName}-{msaName}\"}"),
    );
    let e = p.target(&req(json!({"clusterName": "c1"}))).unwrap_err();
    assert!(
        e.to_string()
            .contains("has no msaName, which nameTemplate \"{clusterName}-{msaName}\" needs (or set kubernetesSecret.templateDefaults.msaName)"),
        "{e}"
    );
}

#[test]
fn resolved_names_must_be_secret_names() {
    let p = KubernetesSecretProvider::new("s", config("{namespace: n}"));
    for bad in ["Alpha", "a/b", "..", "a_b", "-a", ""] {
        let e = p.target(&req(json!({"clusterName": bad})));
        assert!(
            matches!(e, Err(ProviderError::InvalidRequest(_))),
            "{bad:?}"
        );
    }
    let e = p
        .target(&req(json!({"clusterName": "a", "namespace": "other"})))
        .unwrap_err();
    assert!(e.to_string().contains("watches only \"n\""), "{e}");
    // Same namespace and a per-cluster key are fine.
    let t = p
        .target(&req(
            json!({"clusterName": "a", "namespace": "n", "key": "value"}),
        ))
        .unwrap();
    assert_eq!(t.key, "value");
}

#[test]
fn kubeconfig_context_comes_from_config_or_cluster() {
    let p = KubernetesSecretProvider::new(
        "s",
        config("{namespace: n, format: kubeconfig, key: kubeconfig, context: admin}"),
    );
    let t = p.target(&req(json!({"clusterName": "a"}))).unwrap();
    assert_eq!(t.context.as_deref(), Some("admin"));
    let t = p
        .target(&req(json!({"clusterName": "a", "context": "ro"})))
        .unwrap();
    assert_eq!(t.context.as_deref(), Some("ro"));
    assert_eq!(
        p.key_for(&req(json!({"clusterName": "a"}))).unwrap(),
        "n/a key kubeconfig context admin"
    );
}

// --- token format ----------------------------------------------------------------------

#[test]
fn plain_token_uses_the_lifetime() {
    let before = SystemTime::now();
    let c = token_credential(b"  plain-token\n", HOUR, "key").unwrap();
    assert_eq!(token_of(&c), "plain-token");
    let lifetime = c.expires_at.duration_since(before).unwrap();
    assert!(lifetime >= HOUR && lifetime < HOUR + Duration::from_secs(10));
}

#[test]
fn jwt_token_uses_its_exp() {
    let exp = 4_102_444_800; // 2100-01-01
    let c = token_credential(jwt(exp).as_bytes(), HOUR, "key").unwrap();
    assert_eq!(
        c.expires_at,
        SystemTime::UNIX_EPOCH + Duration::from_secs(exp)
    );
    let e =
        token_credential(jwt(1_000).as_bytes(), HOUR, "key \"token\" of Secret n/a").unwrap_err();
    assert_eq!(
        e,
        ProviderError::Unavailable(
            "the token in key \"token\" of Secret n/a expired at 1970-01-01T00:16:40Z".into()
        )
    );
}

#[test]
fn bad_tokens_are_refused_without_quoting_them() {
    for (data, want) in [
        (&b"   \n"[..], "is empty"),
        (b"two tokens-secret", "whitespace inside"),
        (b"\xff\xfe-secret", "not UTF-8"),
    ] {
        let e = token_credential(data, HOUR, "what")
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
        assert!(!e.contains("secret"), "{e}");
    }
}

// --- kubeconfig format -----------------------------------------------------------------

fn kubeconfig(users: &str, current: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
current-context: {current}
clusters:
- name: c
  cluster: {{server: https://worker.example}}
contexts:
- name: admin
  context: {{cluster: c, user: admin}}
- name: ro
  context: {{cluster: c, user: ro}}
users:
{users}"
    )
}

#[test]
fn kubeconfig_with_a_token() {
    let text = kubeconfig(
        "- name: admin\n  user: {token: admin-token}\n- name: ro\n  user: {token: ro-token}\n",
        "admin",
    );
    let c = kubeconfig_credential(text.as_bytes(), None, HOUR, "k").unwrap();
    assert_eq!(token_of(&c), "admin-token");
    // A named context picks its own user.
    let c = kubeconfig_credential(text.as_bytes(), Some("ro"), HOUR, "k").unwrap();
    assert_eq!(token_of(&c), "ro-token");
    let e = kubeconfig_credential(text.as_bytes(), Some("nope"), HOUR, "k").unwrap_err();
    assert!(
        e.to_string()
            .contains("has no context \"nope\" (contexts: admin, ro)"),
        "{e}"
    );
}

#[test]
fn kubeconfig_with_a_client_certificate() {
    let users = format!(
        "- name: admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(CERT_PEM),
        b64(KEY_PEM)
    );
    let text = kubeconfig(&users, "admin");
    let c = kubeconfig_credential(text.as_bytes(), None, HOUR, "k").unwrap();
    match &c.secret {
        CredentialSecret::ClientCertificate {
            certificate_pem,
            key_pem,
        } => {
            assert_eq!(certificate_pem, CERT_PEM);
            assert_eq!(key_pem.expose(), KEY_PEM);
        }
        CredentialSecret::Token(_) => panic!("expected a client certificate"),
    }
    // Expiry is the certificate's notAfter, not the lifetime.
    assert_eq!(
        c.expires_at,
        SystemTime::UNIX_EPOCH + Duration::from_secs(CERT_NOT_AFTER)
    );
}

#[test]
fn certificate_expiry_is_read_from_the_certificate() {
    assert_eq!(
        certificate_not_after(CERT_PEM).unwrap(),
        SystemTime::UNIX_EPOCH + Duration::from_secs(CERT_NOT_AFTER)
    );
    assert!(
        certificate_not_after(KEY_PEM)
            .unwrap_err()
            .contains("PRIVATE KEY, not a CERTIFICATE")
    );
    assert!(certificate_not_after("junk").is_err());
}

#[test]
fn kubeconfig_users_that_need_more_than_the_kubeconfig_are_refused() {
    let cases = [
        (
            "- name: admin\n  user:\n    exec: {apiVersion: client.authentication.k8s.io/v1, command: aws}\n",
            "runs an exec plugin",
        ),
        (
            "- name: admin\n  user:\n    auth-provider: {name: gcp}\n",
            "uses an auth-provider",
        ),
        (
            "- name: admin\n  user: {tokenFile: /var/run/token}\n",
            "has tokenFile but neither",
        ),
        (
            "- name: admin\n  user: {client-certificate: /c.pem, client-key: /k.pem}\n",
            "credentials in files",
        ),
        (
            "- name: admin\n  user: {client-certificate-data: Zm9v}\n",
            "only one of client-certificate-data and client-key-data",
        ),
        (
            "- name: admin\n  user: {client-certificate-data: '!!!', client-key-data: Zm9v}\n",
            "client-certificate-data is not base64",
        ),
        (
            "- name: other\n  user: {token: t}\n",
            "does not have (users: other)",
        ),
    ];
    for (users, want) in cases {
        let text = kubeconfig(users, "admin");
        let e = kubeconfig_credential(
            text.as_bytes(),
            None,
            HOUR,
            "key \"kubeconfig\" of Secret n/a",
        )
        .unwrap_err();
        assert!(matches!(e, ProviderError::InvalidRequest(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.starts_with("key \"kubeconfig\" of Secret n/a: ") && e.contains(want),
            "{users}: {e}"
        );
    }
}

#[test]
fn malformed_kubeconfigs_say_where_but_never_what() {
    let e = kubeconfig_credential(b"users: [\n  {token: sekrit-value", None, HOUR, "k")
        .unwrap_err()
        .to_string();
    assert!(e.contains("YAML syntax error at line"), "{e}");
    assert!(!e.contains("sekrit"), "{e}");
    let e = kubeconfig_credential(b"just-a-token-sekrit", None, HOUR, "k")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a YAML mapping"), "{e}");
    assert!(!e.contains("sekrit"), "{e}");
    let e = kubeconfig_credential(b"users: []\n", None, HOUR, "k")
        .unwrap_err()
        .to_string();
    assert!(e.contains("has no current-context"), "{e}");
}

// --- against a store -------------------------------------------------------------------

/// A provider whose watch is a store these tests fill by hand.
struct Fixture {
    provider: KubernetesSecretProvider,
    writer: reflector::store::Writer<Secret>,
}

fn fixture(section: &str) -> Fixture {
    let provider = KubernetesSecretProvider::new("s", config(section));
    let (store, writer) = reflector::store();
    let status = Arc::new(tokio::sync::watch::Sender::new(WatchStatus::default()));
    let watch = Watch {
        store,
        status,
        task: None,
    };
    assert!(provider.watch.set(watch).is_ok());
    Fixture { provider, writer }
}

impl Fixture {
    fn set_status(&self, synced: bool, connected: bool, error: Option<&str>) {
        let watch = self.provider.watch.get().unwrap();
        watch.status.send_replace(WatchStatus {
            synced,
            connected,
            error: error.map(str::to_owned),
        });
    }

    fn sync(&mut self, secrets: Vec<Secret>) {
        self.writer.apply_watcher_event(&watcher::Event::Init);
        for s in secrets {
            self.writer
                .apply_watcher_event(&watcher::Event::InitApply(s));
        }
        self.writer.apply_watcher_event(&watcher::Event::InitDone);
        self.set_status(true, true, None);
    }
}

fn secret(name: &str, rv: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("n".into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(rv.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

#[tokio::test]
async fn serves_from_the_store_and_sees_updates_and_deletes() {
    let mut f = fixture("{namespace: n}");
    f.sync(vec![secret("a", "1", &[("token", "tok-a-1")])]);
    let r = req(json!({"clusterName": "a"}));
    let c = f.provider.fetch_for(&r).await.unwrap();
    assert_eq!(token_of(&c), "tok-a-1");
    assert!(f.provider.is_current_for(&r, &c));
    assert!(f.provider.available());

    // A rotation: the cached credential is no longer current, a fetch reads the new one.
    f.writer.apply_watcher_event(&watcher::Event::Apply(secret(
        "a",
        "2",
        &[("token", "tok-a-2")],
    )));
    assert!(!f.provider.is_current_for(&r, &c));
    let c2 = f.provider.fetch_for(&r).await.unwrap();
    assert_eq!(token_of(&c2), "tok-a-2");
    assert!(f.provider.is_current_for(&r, &c2));

    // Deleted: not current, and NOT_FOUND naming the Secret.
    f.writer
        .apply_watcher_event(&watcher::Event::Delete(secret("a", "3", &[])));
    assert!(!f.provider.is_current_for(&r, &c2));
    assert_eq!(
        f.provider.fetch_for(&r).await.unwrap_err(),
        ProviderError::NotFound(
            "Secret n/a does not exist or does not match labelSelector \"app=kueue\"".into()
        )
    );
}

#[tokio::test]
async fn missing_key_names_the_key_and_the_secret() {
    let mut f = fixture("{namespace: n, labelSelector: app=kueue}");
    f.sync(vec![secret(
        "a",
        "1",
        &[("ca.crt", "x"), ("namespace", "y")],
    )]);
    assert_eq!(
        f.provider
            .fetch_for(&req(json!({"clusterName": "a"})))
            .await
            .unwrap_err(),
        ProviderError::NotFound(
            "Secret n/a has no key \"token\" (its keys: ca.crt, namespace)".into()
        )
    );
    let e = f
        .provider
        .fetch_for(&req(json!({"clusterName": "b"})))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "Secret n/b does not exist or does not match labelSelector \"app=kueue\""
    );
}

#[tokio::test]
async fn watch_down_serves_the_last_state_and_reports_not_ready() {
    let mut f = fixture("{namespace: n}");
    f.sync(vec![secret("a", "1", &[("token", "tok-a-1")])]);
    f.set_status(
        true,
        false,
        Some("failed to start watching: Connection refused"),
    );
    assert!(!f.provider.available());
    let c = f
        .provider
        .fetch_for(&req(json!({"clusterName": "a"})))
        .await
        .unwrap();
    assert_eq!(token_of(&c), "tok-a-1");
}

#[tokio::test]
async fn never_synced_fails_with_the_watch_error() {
    let f = fixture("{namespace: n}");
    f.set_status(false, false, Some("failed to list: Connection refused"));
    assert!(!f.provider.available());
    assert_eq!(
        f.provider
            .fetch_for(&req(json!({"clusterName": "a"})))
            .await
            .unwrap_err(),
        ProviderError::Unavailable(
            "cannot list the Secrets of namespace n: failed to list: Connection refused".into()
        )
    );
}

#[tokio::test(start_paused = true)]
async fn never_synced_and_silent_times_out() {
    let f = fixture("{namespace: n}");
    let e = f
        .provider
        .fetch_for(&req(json!({"clusterName": "a"})))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        ProviderError::Timeout("the Secrets of namespace n were not listed within 10s".into())
    );
}

#[tokio::test]
async fn kubeconfig_secret_through_the_store() {
    let mut f = fixture("{namespace: n, format: kubeconfig, key: kubeconfig}");
    let text = kubeconfig(
        "- name: admin\n  user: {token: admin-token}\n- name: ro\n  user: {token: ro-token}\n",
        "admin",
    );
    f.sync(vec![secret("a", "1", &[("kubeconfig", &text)])]);
    let c = f
        .provider
        .fetch_for(&req(json!({"clusterName": "a", "context": "ro"})))
        .await
        .unwrap();
    assert_eq!(token_of(&c), "ro-token");
}

#[test]
fn debug_never_prints_the_store() {
    let mut f = fixture("{namespace: n}");
    f.sync(vec![secret("a", "1", &[("token", "TOKEN-MATERIAL")])]);
    let printed = format!("{:?}", f.provider);
    assert!(!printed.contains("MATERIAL"), "{printed}");
    assert!(printed.contains("synced: true"), "{printed}");
}

use serde_json::json;

#[test]
fn no_proxy_lists_are_honoured() {
    let cases = [
        ("127.0.0.1", "127.0.0.1", true),
        ("127.0.0.1", "localhost,127.0.0.1:6443", true),
        ("api.hub.example.com", "example.com", true),
        ("api.hub.example.com", ".example.com", true),
        ("example.com", ".example.com", true),
        ("notexample.com", "example.com", false),
        ("api.hub.example.com", "other.com, hub.example.org", false),
        ("anything", "*", true),
        ("[::1]", "::1", true),
        ("[::1]", "[::1]:443", true),
        ("10.0.0.1", "", false),
    ];
    for (host, no_proxy, want) in cases {
        assert_eq!(
            bypasses_proxy(host, no_proxy),
            want,
            "{host} vs {no_proxy:?}"
        );
    }
}
