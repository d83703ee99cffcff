use serde_json::{Map, Value, json};

use super::*;
use crate::config::Config;
use crate::request::ClusterInfo;

/// The first provider of a config whose `providers:` list is `entries` (YAML).
fn provider(entries: &str) -> ProviderConfig {
    Config::parse(&format!("providers:\n{entries}"), "t.yaml")
        .unwrap()
        .providers
        .remove(0)
}

fn config_error(entries: &str) -> String {
    Config::parse(&format!("providers:\n{entries}"), "t.yaml")
        .unwrap_err()
        .to_string()
}

fn request(config: Value) -> TokenRequest {
    let config: Map<String, Value> = serde_json::from_value(config).unwrap();
    TokenRequest {
        provider: "p".into(),
        cluster: Some(ClusterInfo {
            server: "https://w1.example".into(),
            config: config.into(),
            ..Default::default()
        }),
        interactive: false,
    }
}

fn refused(config: &ProviderConfig, cluster: Value) -> String {
    check(config, &request(cluster.clone()))
        .expect_err(&format!("{cluster} should be refused"))
        .to_string()
}

fn allowed(config: &ProviderConfig, cluster: Value) {
    if let Err(e) = check(config, &request(cluster.clone())) {
        panic!("{cluster} should be allowed: {e}");
    }
}

#[test]
fn glob_matches_whole_values_with_star_and_question_mark() {
    let yes = [
        ("*", ""),
        ("*", "anything at all"),
        ("abc", "abc"),
        ("a?c", "abc"),
        ("a*", "a"),
        ("*c", "abc"),
        ("a*c", "abbbbc"),
        ("a*b*c", "a-b-b-c"),
        ("**", "x"),
        ("?", "é"),
        (
            "arn:aws:iam::123456789012:role/kueue-*",
            "arn:aws:iam::123456789012:role/kueue-workers",
        ),
        ("*-?", "x-y-z"),
    ];
    for (p, v) in yes {
        assert!(glob_match(p, v), "{p:?} should match {v:?}");
    }
    let no = [
        ("", "a"),
        ("abc", "abcd"),
        ("abc", "ab"),
        ("a?c", "ac"),
        ("?", ""),
        ("a*c", "abcd"),
        ("kueue-*", "xkueue-a"),
        (
            "arn:aws:iam::123456789012:role/kueue-*",
            "arn:aws:iam::123456789012:role/admin",
        ),
        (
            "arn:aws:iam::123456789012:role/kueue-*",
            "arn:aws:iam::999999999999:role/kueue-x",
        ),
        ("ABC", "abc"),
    ];
    for (p, v) in no {
        assert!(!glob_match(p, v), "{p:?} should not match {v:?}");
    }
    // `/` is matched only by itself; a control character matches nothing.
    for (p, v) in [
        (
            "arn:aws:iam::123456789012:role/kueue-*",
            "arn:aws:iam::123456789012:role/kueue-x/../../admin",
        ),
        ("a*", "a/b"),
        ("a?b", "a/b"),
        ("*", "a\nb"),
        ("a*", "a\rb"),
        ("kueue-*", "kueue-\u{1b}[2J"),
        ("*", "\u{7f}"),
    ] {
        assert!(!glob_match(p, v), "{p:?} should not match {v:?}");
    }
    assert!(glob_match(
        "arn:aws:iam::123456789012:role/*/kueue-*",
        "arn:aws:iam::123456789012:role/batch/kueue-a"
    ));
    assert!(glob_match("a/*", "a/b"));
    // `*` in the value is just a character; a hostile value stays cheap.
    assert!(glob_match("a*", "a*b"));
    assert!(!glob_match("a?", "a*b"));
    let long = "a".repeat(20_000);
    assert!(!glob_match("*a*a*a*a*b", &long));
}

const AWS: &str = "  - name: eks\n    type: aws\n    aws: {region: us-west-2, roleArn: \"arn:aws:iam::111122223333:role/kueue\", externalId: ext-own}\n";
const ROLE_ADMIN: &str = "arn:aws:iam::111122223333:role/admin";

#[test]
fn aws_identity_keys_are_refused_by_default() {
    let eks = provider(AWS);
    let e = refused(&eks, json!({"clusterName": "w1", "roleArn": ROLE_ADMIN}));
    assert_eq!(
        e,
        format!(
            "override refused: the cluster's exec config sets roleArn \"{ROLE_ADMIN}\", which selects the IAM role the broker assumes with its own credentials; \
             provider \"eks\" allows no per-cluster roleArn; to allow it, add to provider \"eks\": allowOverrides: {{roleArn: [\"{ROLE_ADMIN}\"]}} (glob patterns, * and ?)"
        )
    );
    let e = refused(&eks, json!({"clusterName": "w1", "sessionName": "admin"}));
    assert!(e.contains("sets sessionName \"admin\""), "{e}");
    // An external id may be a secret shared with the role's owner: never echoed.
    let e = refused(
        &eks,
        json!({"clusterName": "w1", "externalId": "their-secret"}),
    );
    assert!(!e.contains("their-secret"), "{e}");
    assert!(e.contains("externalId (value not shown)"), "{e}");
    assert!(
        e.contains("allowOverrides: {externalId: [\"<pattern>\"]}"),
        "{e}"
    );
    // Non-string values are read the way the provider reads them.
    let e = refused(&eks, json!({"clusterName": "w1", "sessionName": 12345}));
    assert!(e.contains("sessionName \"12345\""), "{e}");
}

#[test]
fn aws_locating_keys_and_the_providers_own_values_pass() {
    let eks = provider(AWS);
    allowed(
        &eks,
        json!({"clusterName": "w1", "clusterId": "0123-abcd", "region": "eu-west-1", "stsEndpoint": "x"}),
    );
    allowed(
        &eks,
        json!({"clusterName": "w1", "roleArn": "arn:aws:iam::111122223333:role/kueue", "externalId": "ext-own"}),
    );
    // The provider's session name default, spelled out.
    if cfg!(feature = "aws") {
        allowed(
            &eks,
            json!({"clusterName": "w1", "sessionName": "credbroker"}),
        );
    }
    // Empty and non-scalar values are absent for the provider too.
    allowed(
        &eks,
        json!({"clusterName": "w1", "roleArn": "", "sessionName": {"a": 1}}),
    );
}

#[test]
fn aws_allow_overrides_globs_let_matching_values_through() {
    let eks = provider(
        "  - name: eks\n    type: aws\n    allowOverrides: {roleArn: [\"arn:aws:iam::123456789012:role/kueue-*\", \"arn:aws:iam::210987654321:role/batch\"]}\n    aws: {region: us-west-2}\n",
    );
    allowed(
        &eks,
        json!({"clusterName": "w1", "roleArn": "arn:aws:iam::123456789012:role/kueue-east"}),
    );
    allowed(
        &eks,
        json!({"clusterName": "w1", "roleArn": "arn:aws:iam::210987654321:role/batch"}),
    );
    let e = refused(
        &eks,
        json!({"clusterName": "w1", "roleArn": "arn:aws:iam::123456789012:role/admin"}),
    );
    assert!(
        e.contains(
            "it matches none of the 2 pattern(s) in allowOverrides.roleArn of provider \"eks\""
        ),
        "{e}"
    );
    // Allowing roleArn allows nothing else.
    let e = refused(
        &eks,
        json!({"clusterName": "w1", "roleArn": "arn:aws:iam::123456789012:role/kueue-east", "sessionName": "x1"}),
    );
    assert!(e.contains("per-cluster sessionName"), "{e}");
}

#[test]
fn azure_tenant_and_audience_are_refused_by_default() {
    let aks = provider("  - {name: aks, type: azure}\n");
    let e = refused(
        &aks,
        json!({"clusterName": "a", "tenantId": "fabrikam.onmicrosoft.com"}),
    );
    assert!(
        e.contains("allowOverrides: {tenantId: [\"fabrikam.onmicrosoft.com\"]}"),
        "{e}"
    );
    // An audience of the ClusterProfile writer's choosing is a token for any Entra app.
    let e = refused(
        &aks,
        json!({"clusterName": "a", "serverId": "https://graph.microsoft.com"}),
    );
    assert!(
        e.contains("sets serverId \"https://graph.microsoft.com\""),
        "{e}"
    );
    assert!(e.contains("audience"), "{e}");
    allowed(
        &aks,
        json!({"clusterName": "a", "server": "x", "region": "westeurope"}),
    );
    if cfg!(feature = "azure") {
        // The AKS server application, the provider's default, spelled out.
        allowed(
            &aks,
            json!({"serverId": "6dae42f8-4368-4678-94ff-3960e28e3630"}),
        );
    }

    let aks = provider(
        "  - name: aks\n    type: azure\n    allowOverrides: {tenantId: [\"*.onmicrosoft.com\"]}\n    azure: {tenantId: contoso.onmicrosoft.com}\n",
    );
    allowed(&aks, json!({"tenantId": "contoso.onmicrosoft.com"}));
    allowed(&aks, json!({"tenantId": "fabrikam.onmicrosoft.com"}));
    let e = refused(
        &aks,
        json!({"tenantId": "11111111-2222-3333-4444-555555555555"}),
    );
    assert!(
        e.contains("matches none of the 1 pattern(s) in allowOverrides.tenantId"),
        "{e}"
    );
}

#[test]
fn gcp_exec_and_file_have_no_selector_keys() {
    let cluster = json!({
        "clusterName": "c", "impersonateServiceAccount": "admin@p.iam.gserviceaccount.com",
        "scopes": "x", "roleArn": ROLE_ADMIN, "key": "admin-token",
    });
    for entry in [
        "  - {name: gke, type: gcp}\n",
        "  - {name: onprem, type: exec, exec: {command: /bin/plugin}}\n",
        "  - {name: static, type: file, file: {path: \"/t/{clusterName}\"}}\n",
    ] {
        let config = provider(entry);
        assert!(selector_keys(&config).is_empty(), "{entry}");
        allowed(&config, cluster.clone());
    }
}

const SECRETS: &str = "  - name: ocm\n    type: kubernetesSecret\n    kubernetesSecret: {labelSelector: app=kueue, namespace: kueue-system, nameTemplate: \"{clusterName}-{msaName}\", templateDefaults: {msaName: kueue}}\n";

#[test]
fn kubernetes_secret_key_context_and_placeholders_are_refused_by_default() {
    let ocm = provider(SECRETS);
    let names: Vec<String> = selector_keys(&ocm)
        .into_iter()
        .map(|k| k.name.into_owned())
        .collect();
    assert_eq!(names, ["key", "msaName"]);
    let e = refused(&ocm, json!({"clusterName": "w1", "key": "admin-token"}));
    assert!(
        e.contains("sets key \"admin-token\", which selects the data key"),
        "{e}"
    );
    assert!(
        e.contains("allowOverrides: {key: [\"admin-token\"]}"),
        "{e}"
    );
    let e = refused(&ocm, json!({"clusterName": "w1", "msaName": "payroll"}));
    assert!(
        e.contains("sets msaName \"payroll\", which selects part of the name of the Secret"),
        "{e}"
    );
    // Locating keys and the provider's own values pass.
    allowed(
        &ocm,
        json!({"clusterName": "w1", "namespace": "kueue-system", "key": "token", "msaName": "kueue"}),
    );
    // context is read only with format: kubeconfig.
    allowed(&ocm, json!({"clusterName": "w1", "context": "admin"}));
    let kc = provider(
        "  - name: kc\n    type: kubernetesSecret\n    kubernetesSecret: {labelSelector: app=kueue, namespace: ns, format: kubeconfig, key: kubeconfig}\n",
    );
    let e = refused(&kc, json!({"clusterName": "w1", "context": "admin"}));
    assert!(e.contains("sets context \"admin\""), "{e}");
    allowed(&kc, json!({"clusterName": "w1", "key": "kubeconfig"}));
}

#[test]
fn kubernetes_secret_allow_overrides() {
    let ocm = provider(
        "  - name: ocm\n    type: kubernetesSecret\n    allowOverrides: {msaName: [\"kueue-*\"], key: [token, ca.crt]}\n    kubernetesSecret: {labelSelector: app=kueue, namespace: kueue-system, nameTemplate: \"{clusterName}-{msaName}\"}\n",
    );
    allowed(
        &ocm,
        json!({"clusterName": "w1", "msaName": "kueue-batch", "key": "ca.crt"}),
    );
    let e = refused(&ocm, json!({"clusterName": "w1", "msaName": "payroll"}));
    assert!(e.contains("allowOverrides.msaName"), "{e}");
}

#[test]
fn refusal_quotes_outside_text_safely() {
    let eks = provider(AWS);
    let evil = format!("{}\n2026 INFO forged\u{1b}[31m", "x".repeat(1000));
    let e = refused(&eks, json!({"clusterName": "w1", "roleArn": evil}));
    assert!(!e.chars().any(char::is_control), "{e:?}");
    assert!(e.len() < 1500, "{} bytes", e.len());
}

#[test]
fn allow_overrides_is_validated_by_check_config() {
    let cases = [
        (
            "  - {name: eks, type: aws, allowOverrides: {rolearn: [x]}}\n",
            "t.yaml: providers[0].allowOverrides.rolearn: \"rolearn\" is not a per-cluster key that provider type aws lets a cluster override; the overridable keys are: roleArn, externalId, sessionName",
        ),
        (
            "  - {name: eks, type: aws, allowOverrides: {roleArn: []}}\n",
            "t.yaml: providers[0].allowOverrides.roleArn: must list at least one glob pattern (* and ?), like [\"arn:aws:iam::111122223333:role/kueue-*\"]",
        ),
        (
            "  - {name: eks, type: aws, allowOverrides: {roleArn: [\"\"]}}\n",
            "providers[0].allowOverrides.roleArn[0]: a pattern is a non-empty line",
        ),
        (
            "  - {name: eks, type: aws, allowOverrides: {region: [\"*\"]}}\n",
            "providers[0].allowOverrides.region: region only locates the cluster and is always allowed",
        ),
        (
            "  - {name: gke, type: gcp, allowOverrides: {scopes: [\"*\"]}}\n",
            "providers[0].allowOverrides.scopes: type gcp has no per-cluster keys that select an identity or a secret",
        ),
        (
            "  - {name: f, type: file, file: {path: /t}, allowOverrides: {path: [\"*\"]}}\n",
            "type file has no per-cluster keys",
        ),
        (
            "  - {name: aks, type: azure, allowOverrides: {clientId: [\"*\"]}}\n",
            "the overridable keys are: tenantId, serverId",
        ),
        (
            "  - {name: ocm, type: kubernetesSecret, kubernetesSecret: {labelSelector: app=kueue, namespace: ns}, allowOverrides: {context: [a]}}\n",
            "providers[0].allowOverrides.context: \"context\" is not a per-cluster key that provider type kubernetesSecret lets a cluster override (its keys are key, context with format: kubeconfig, and the nameTemplate's placeholders other than clusterName); the overridable keys are: key",
        ),
        (
            "  - {name: ocm, type: kubernetesSecret, kubernetesSecret: {labelSelector: app=kueue, namespace: ns}, allowOverrides: {namespace: [a]}}\n",
            "namespace only locates the cluster",
        ),
        (
            "  - {name: eks, type: aws, allowOverrides: [roleArn]}\n",
            "providers[0].allowOverrides: invalid type: sequence, expected a map",
        ),
        (
            "  - {name: eks, type: aws, allowOverrides: {roleArn: x}}\n",
            "providers[0].allowOverrides.roleArn: invalid type: string \"x\", expected a sequence",
        ),
    ];
    for (entry, want) in cases {
        let e = config_error(entry);
        assert!(e.contains(want), "{entry}: got {e:?}, want {want:?}");
    }
    // Placeholders of the template are overridable keys; the slice's example parses.
    provider(
        "  - {name: ocm, type: kubernetesSecret, kubernetesSecret: {labelSelector: app=kueue, namespace: ns, nameTemplate: \"{clusterName}-{team}\", format: kubeconfig}, allowOverrides: {team: [a], context: [b], key: [c]}}\n",
    );
    let eks = provider(
        "  - name: eks\n    type: aws\n    allowOverrides: {roleArn: [\"arn:aws:iam::123456789012:role/kueue-*\"]}\n    aws: {region: us-west-2}\n",
    );
    assert_eq!(
        eks.allow_overrides["roleArn"],
        ["arn:aws:iam::123456789012:role/kueue-*"]
    );
}
