//! What the `exec` and `file` providers hand to plugins and derive from their answers:
//! args/env, timeouts, Struct number normalisation, and come-back times (expiry).

use std::time::{Duration, Instant};

use base64::Engine as _;
use credbroker_tests::{
    Broker, ExecPlugin, PluginOptions, TokenFiles, V1, assert_credential, assert_shim_error,
    config_yaml, exec_info, exec_provider, file_provider, process_alive, run_shim, yaml_str,
};
use serde_json::{Value, json};
use time::OffsetDateTime;

/// One shim call for cluster `name` through `provider`; returns the credential.
fn call(broker: &Broker, provider: &str, config: Value) -> credbroker_tests::Credential {
    let info = exec_info(V1, "https://providers.example", config);
    let out = run_shim(broker.socket(), &["--provider", provider], Some(&info));
    assert_credential(&out, V1)
}

fn secs(s: u64) -> time::Duration {
    time::Duration::seconds(i64::try_from(s).expect("small"))
}

#[test]
fn exec_args_and_env_reach_the_plugin() {
    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config_yaml(&[exec_provider(
        "onprem",
        plugin.command(),
        r#"args: [first, "two words"], env: {CREDBROKER_E2E_VAR: "hello there"}"#,
    )]));
    let cred = call(&broker, "onprem", json!({"clusterName": "args"}));
    assert_eq!(cred.token, "tok-args-1");
    assert_eq!(plugin.args(1), vec!["first", "two words"]);
    assert_eq!(
        plugin.env_var(1, "CREDBROKER_E2E_VAR").as_deref(),
        Some("hello there")
    );
    assert!(
        plugin.env_var(1, "PATH").is_some(),
        "the plugin should inherit the broker's environment"
    );
    let info = plugin.exec_info(1);
    assert_eq!(info["spec"]["interactive"], false, "{info}");
}

#[test]
fn exec_timeout_kills_the_process_group() {
    let plugin = ExecPlugin::with(PluginOptions {
        hang: true,
        ..PluginOptions::default()
    });
    let broker = Broker::start(&config_yaml(&[exec_provider(
        "stuck",
        plugin.command(),
        "timeout: 1s",
    )]));
    let info = exec_info(V1, "https://stuck.example", json!({"clusterName": "stuck"}));
    let started = Instant::now();
    let out = run_shim(broker.socket(), &["--provider", "stuck"], Some(&info));
    let elapsed = started.elapsed();
    assert_shim_error(&out, &["stuck"]);
    assert!(
        elapsed < Duration::from_secs(10),
        "a plugin with `timeout: 1s` held the call for {elapsed:?}"
    );
    let child = plugin
        .child_pid(1)
        .expect("the hanging plugin recorded its child's pid");
    let gone = credbroker_tests::wait_until(Duration::from_secs(5), || !process_alive(child));
    if !gone {
        // Leave nothing behind, then fail.
        credbroker_tests::send_signal(child, "KILL");
    }
    assert!(
        gone,
        "the plugin's child (pid {child}) survived the timeout: the process group was not killed"
    );
}

#[test]
fn exec_struct_numbers_are_normalised() {
    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config_yaml(&[exec_provider(
        "onprem",
        plugin.command(),
        "",
    )]));
    let config = json!({"clusterName": "nums", "port": 443, "ratio": 0.5, "nested": {"count": 2}, "list": [1, 2]});
    for _ in 0..2 {
        assert_eq!(call(&broker, "onprem", config.clone()).token, "tok-nums-1");
    }
    assert_eq!(plugin.runs(), 1, "one cluster config, one plugin run");
    let seen = &plugin.exec_info(1)["spec"]["cluster"]["config"];
    assert_eq!(
        seen["port"].as_u64(),
        Some(443),
        "integral numbers stay integers: {seen}"
    );
    assert_eq!(seen["nested"]["count"].as_u64(), Some(2), "{seen}");
    assert_eq!(seen["list"], json!([1, 2]), "{seen}");
    assert_eq!(seen["ratio"].as_f64(), Some(0.5), "{seen}");
    assert_eq!(seen["clusterName"], "nums", "{seen}");
}

#[test]
fn exec_come_back_is_before_the_plugin_expiry() {
    let plugin = ExecPlugin::with(PluginOptions {
        expires_in: Some(Duration::from_secs(3600)),
        ..PluginOptions::default()
    });
    let broker = Broker::start(&config_yaml(&[exec_provider(
        "onprem",
        plugin.command(),
        "",
    )]));
    let cred = call(&broker, "onprem", json!({"clusterName": "exp"}));
    let after = OffsetDateTime::now_utc();
    assert!(
        cred.expiration < after + secs(3600),
        "come-back {} is not before the plugin's expiry (~{})",
        cred.expiration,
        after + secs(3600)
    );
}

#[test]
fn exec_default_lifetime_without_expiration() {
    let plugin = ExecPlugin::with(PluginOptions::default());
    let broker = Broker::start(&config_yaml(&[exec_provider(
        "onprem",
        plugin.command(),
        "defaultLifetime: 10m",
    )]));
    let cred = call(&broker, "onprem", json!({"clusterName": "lifetime"}));
    let after = OffsetDateTime::now_utc();
    assert!(
        cred.expiration <= after + secs(600),
        "come-back {} is past the 10m defaultLifetime",
        cred.expiration
    );
}

/// An unsigned JWT whose payload carries `exp`.
fn jwt(exp: i64) -> String {
    let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!(
        "{}.{}.c2lnbmF0dXJl",
        b64(json!({"alg": "RS256", "typ": "JWT"})),
        b64(json!({"sub": "system:serviceaccount:kueue:worker", "exp": exp}))
    )
}

#[test]
fn file_jwt_exp_and_lifetime() {
    let files = TokenFiles::new();
    let now = OffsetDateTime::now_utc();
    let jwt_exp = now + secs(20 * 60);
    let token = jwt(jwt_exp.unix_timestamp());
    files.write("jwt", &token);
    files.write("opaque", "opaque-token");
    let broker = Broker::start(&format!(
        "socket: {{path: \"{{socket}}\"}}\nproviders:\n  - name: static\n    type: file\n    file: {{path: {}, lifetime: 30m}}\n{}",
        yaml_str(files.template()),
        file_provider("default-lifetime", &files.template()),
    ));
    let cred = call(&broker, "static", json!({"clusterName": "jwt"}));
    assert_eq!(cred.token, token);
    assert!(
        cred.expiration <= jwt_exp,
        "come-back {} is past the JWT's exp {jwt_exp}",
        cred.expiration
    );
    let cred = call(&broker, "static", json!({"clusterName": "opaque"}));
    assert_eq!(cred.token, "opaque-token");
    let after = OffsetDateTime::now_utc();
    assert!(
        cred.expiration <= after + secs(30 * 60),
        "come-back {} is past the 30m lifetime",
        cred.expiration
    );
    // Without `lifetime` the provider still answers with a come-back time in the future.
    let cred = call(
        &broker,
        "default-lifetime",
        json!({"clusterName": "opaque"}),
    );
    assert_eq!(cred.token, "opaque-token");
}
