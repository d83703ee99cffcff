//! The exec provider against real shell-script plugins (real time: process I/O).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::*;
use crate::config::providers::exec::{EXEC_API_V1, EXEC_API_V1BETA1};
use crate::config::values::ConfigDuration;
use crate::providers::ProviderTestExt as _;
use crate::request::ClusterInfo;
use credbroker_execcred::parse_rfc3339;
use serde_json::json;

fn plugin(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("plugin.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn config(command: PathBuf, api_version: &str, timeout: Duration) -> ExecConfig {
    ExecConfig {
        command,
        args: vec!["one".into(), "two words".into()],
        env: BTreeMap::from([("PLUGIN_MODE".into(), "test".into())]),
        timeout: ConfigDuration(timeout),
        api_version: api_version.into(),
        default_lifetime: ConfigDuration(Duration::from_secs(600)),
        pass_env: Vec::new(),
        inherit_env: false,
    }
}

fn provider(command: PathBuf, api_version: &str, timeout: Duration) -> ExecProvider {
    ExecProvider::new(config(command, api_version, timeout))
}

fn req(cluster: &str) -> TokenRequest {
    let mut config = serde_json::Map::new();
    config.insert("clusterName".into(), cluster.into());
    config.insert("port".into(), 443.into());
    TokenRequest {
        provider: "p".into(),
        cluster: Some(ClusterInfo {
            server: "https://127.0.0.1:6443".into(),
            certificate_authority_data: b"PEM".to_vec(),
            config: config.into(),
            ..Default::default()
        }),
        interactive: true,
    }
}

const TOKEN_OUT: &str = r#"echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"sekrit-token","expirationTimestamp":"2099-01-02T03:04:05Z"}}'"#;

#[tokio::test]
async fn hands_the_plugin_what_client_go_would_and_parses_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen");
    let body = format!(
        "printf '%s' \"$KUBERNETES_EXEC_INFO\" > {seen}.info\nprintf '%s|%s|%s' \"$1\" \"$2\" \"$PLUGIN_MODE\" > {seen}.args\n{TOKEN_OUT}",
        seen = seen.display()
    );
    let p = provider(
        plugin(dir.path(), &body),
        EXEC_API_V1BETA1,
        Duration::from_secs(10),
    );
    let cred = p.fetch_for(&req("a")).await.unwrap();
    assert_eq!(
        cred.secret,
        CredentialSecret::Token(Secret::new("sekrit-token"))
    );
    assert_eq!(
        cred.expires_at,
        parse_rfc3339("2099-01-02T03:04:05Z").unwrap()
    );
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("seen.info")).unwrap())
            .unwrap();
    assert_eq!(info["apiVersion"], EXEC_API_V1BETA1);
    assert_eq!(info["kind"], "ExecCredential");
    assert_eq!(
        info["spec"]["interactive"], false,
        "a wrapped plugin never prompts"
    );
    assert_eq!(info["spec"]["cluster"]["server"], "https://127.0.0.1:6443");
    assert_eq!(
        info["spec"]["cluster"]["certificate-authority-data"],
        "UEVN"
    );
    assert_eq!(info["spec"]["cluster"]["config"]["clusterName"], "a");
    assert_eq!(
        info["spec"]["cluster"]["config"]["port"], 443,
        "integral numbers stay integers"
    );
    let args = std::fs::read_to_string(dir.path().join("seen.args")).unwrap();
    assert_eq!(args, "one|two words|test");
}

#[tokio::test]
async fn client_certificates_and_default_lifetime() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"echo '{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"clientCertificateData":"CERT","clientKeyData":"KEY"}}'"#;
    let p = provider(
        plugin(dir.path(), body),
        EXEC_API_V1,
        Duration::from_secs(10),
    );
    let before = SystemTime::now();
    let cred = p.fetch_for(&req("a")).await.unwrap();
    assert_eq!(
        cred.secret,
        CredentialSecret::ClientCertificate {
            certificate_pem: "CERT".into(),
            key_pem: Secret::new("KEY")
        }
    );
    let lifetime = cred.expires_at.duration_since(before).unwrap();
    assert!(lifetime >= Duration::from_secs(600) && lifetime < Duration::from_secs(610));
}

#[tokio::test]
async fn a_failing_plugin_reports_its_exit_code_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let body = "echo 'first problem' >&2\necho 'second problem' >&2\nexit 3";
    let p = provider(
        plugin(dir.path(), body),
        EXEC_API_V1,
        Duration::from_secs(10),
    );
    let err = p.fetch_for(&req("a")).await.unwrap_err();
    assert!(err.is_transient());
    let msg = err.to_string();
    assert!(msg.contains("exited with code 3"), "{msg}");
    assert!(msg.contains("first problem | second problem"), "{msg}");
}

#[tokio::test]
async fn bad_output_is_refused_without_quoting_it() {
    let cases = [
        ("echo 'sekrit-token'", "not JSON"),
        (
            r#"echo '{"apiVersion":"v9","kind":"ExecCredential","status":{"token":"sekrit-token"}}'"#,
            "apiVersion",
        ),
        (
            r#"echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"Pod","status":{"token":"sekrit-token"}}'"#,
            "kind",
        ),
        (
            r#"echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{}}'"#,
            "neither token",
        ),
        (
            r#"echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientKeyData":"sekrit-token"}}'"#,
            "go together",
        ),
        (
            r#"echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"sekrit-token","expirationTimestamp":"tomorrow"}}'"#,
            "RFC 3339",
        ),
    ];
    for (body, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let p = provider(
            plugin(dir.path(), body),
            EXEC_API_V1,
            Duration::from_secs(10),
        );
        let msg = p.fetch_for(&req("a")).await.unwrap_err().to_string();
        assert!(msg.contains(want), "{body}: {msg}");
        assert!(!msg.contains("sekrit"), "{body}: leaks the secret: {msg}");
    }
}

#[tokio::test]
async fn a_missing_plugin_is_a_clear_error() {
    let p = provider(
        PathBuf::from("/nonexistent/plugin"),
        EXEC_API_V1,
        Duration::from_secs(10),
    );
    let msg = p.fetch_for(&req("a")).await.unwrap_err().to_string();
    assert!(
        msg.contains("cannot run exec plugin /nonexistent/plugin"),
        "{msg}"
    );
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child.pid");
    let body = format!("sleep 60 &\necho $! > {}\nsleep 60", pidfile.display());
    let p = provider(
        plugin(dir.path(), &body),
        EXEC_API_V1,
        Duration::from_millis(500),
    );
    let started = std::time::Instant::now();
    let err = p.fetch_for(&req("a")).await.unwrap_err();
    assert!(matches!(err, ProviderError::Timeout(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let child: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The background grandchild was killed too (give the kernel a moment to reap it).
    let mut gone = false;
    for _ in 0..50 {
        let state = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for init to reap it.
        if state.is_empty() || state.split(' ').nth(2) == Some("Z") {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone, "grandchild {child} survived the timeout");
}

/// Whether `pid` has exited (gone, or a zombie whose parent has not reaped it yet: `kill(pid,
/// 0)` still succeeds on those, but they run nothing).
fn exited(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.is_empty()
        || stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            == Some("Z")
}

/// Polls (bounded: 5 s) until `cond` holds.
async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..250 {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn giving_up_on_the_plugin_kills_and_reaps_its_process_group() {
    // The cache's upstream timeout (or a shutdown) drops the fetch before the plugin's own
    // timeout: nothing the plugin started may outlive that.
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let body = format!(
        "sleep 60 &\necho $$ $! > {tmp}\nmv {tmp} {pids}\nsleep 60",
        tmp = dir.path().join("pids.tmp").display(),
        pids = pids.display()
    );
    let p = provider(
        plugin(dir.path(), &body),
        EXEC_API_V1,
        Duration::from_secs(30),
    );
    let request = req("a");
    let mut fetch = p.fetch_for(&request);
    let started = tokio::select! {
        _ = &mut fetch => panic!("the plugin cannot have answered"),
        started = eventually(|| pids.exists()) => started,
    };
    assert!(started, "the plugin never wrote its pids");
    drop(fetch);
    let text = std::fs::read_to_string(&pids).unwrap();
    let (plugin_pid, child_pid) = text.trim().split_once(' ').unwrap();
    let (plugin_pid, child_pid): (i32, i32) =
        (plugin_pid.parse().unwrap(), child_pid.parse().unwrap());
    assert!(
        eventually(|| exited(child_pid)).await,
        "the plugin's background child {child_pid} survived"
    );
    // The plugin itself is the broker's child: killed and reaped, not left a zombie.
    assert!(
        eventually(|| !Path::new(&format!("/proc/{plugin_pid}")).exists()).await,
        "the plugin {plugin_pid} was not killed and reaped"
    );
}

#[tokio::test]
async fn a_plugin_that_writes_a_lot_to_stderr_still_gets_its_credential_served() {
    // client-go drains both pipes; closing one early kills the plugin with SIGPIPE.
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "noise=$(head -c 131072 /dev/zero | tr '\\0' x)\nprintf '%s\\n' \"$noise\" >&2\n{TOKEN_OUT}"
    );
    let p = provider(
        plugin(dir.path(), &body),
        EXEC_API_V1,
        Duration::from_secs(10),
    );
    let cred = p.fetch_for(&req("a")).await.unwrap();
    assert_eq!(
        cred.secret,
        CredentialSecret::Token(Secret::new("sekrit-token"))
    );
}

#[tokio::test]
async fn an_over_long_stdout_is_reported_as_such() {
    let dir = tempfile::tempdir().unwrap();
    // 100 MB, then exit with head's status: 141 (SIGPIPE) if the broker stops reading.
    let p = provider(
        plugin(dir.path(), "head -c 104857600 /dev/zero"),
        EXEC_API_V1,
        Duration::from_secs(20),
    );
    let msg = p.fetch_for(&req("a")).await.unwrap_err().to_string();
    assert!(
        msg.contains(&format!("printed more than {MAX_STDOUT} bytes")),
        "{msg}"
    );
}

#[tokio::test]
async fn plugin_stderr_cannot_inject_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let body = "printf 'bad \\033[31mred\\r\\033]0;title\\007\\n2026-01-01T00:00:00Z INFO forged\\n' >&2\nexit 2";
    let p = provider(
        plugin(dir.path(), body),
        EXEC_API_V1,
        Duration::from_secs(10),
    );
    let msg = p.fetch_for(&req("a")).await.unwrap_err().to_string();
    assert!(!msg.chars().any(char::is_control), "{msg:?}");
    assert!(msg.contains("bad \\u{1b}[31mred"), "{msg}");
    assert!(msg.contains("forged"), "{msg}");
}

#[test]
fn tokens_follow_the_one_rule_for_every_provider() {
    let out = |token: &str| {
        json!({"apiVersion": EXEC_API_V1, "kind": "ExecCredential", "status": {"token": token}})
            .to_string()
    };
    let parse = |token: &str| parse_exec_credential(out(token).as_bytes(), Duration::from_secs(60));
    // Surrounding ASCII whitespace is trimmed, as the file and Secret providers always did.
    assert_eq!(
        parse(" \tsekrit-token\r\n").unwrap().secret,
        CredentialSecret::Token(Secret::new("sekrit-token"))
    );
    for bad in [
        "sekrit\r\nInjected: header",
        "sekrit\u{1b}[2J",
        "sekrit\u{0}tail",
        "sekrit token",
        "sekrit\u{7f}",
    ] {
        let e = parse(bad).unwrap_err();
        assert!(e.contains("status.token"), "{bad:?}: {e}");
        assert!(!e.contains("sekrit"), "{bad:?} quoted: {e}");
    }
    assert!(parse("   ").unwrap_err().contains("empty"));
}

#[test]
fn identity_covers_everything_the_plugin_sees_of_the_cluster() {
    let p = provider(
        PathBuf::from("/bin/true"),
        EXEC_API_V1,
        Duration::from_secs(1),
    );
    let base = p.key_for(&req("a")).unwrap();
    let variants: [fn(&mut ClusterInfo); 4] = [
        |c| c.tls_server_name = "other.example".into(),
        |c| c.certificate_authority_data = b"OTHER PEM".to_vec(),
        |c| c.proxy_url = "http://proxy.example:3128".into(),
        |c| c.insecure_skip_tls_verify = true,
    ];
    let mut seen = std::collections::HashSet::from([base]);
    for change in variants {
        let mut r = req("a");
        change(r.cluster.as_mut().unwrap());
        let id = p.key_for(&r).unwrap();
        // CA data is keyed by its digest, never carried whole (base64 of "OTHER PEM").
        assert!(!id.contains("T1RIRVIgUEVN"), "{id}");
        assert!(
            seen.insert(id.clone()),
            "two clusters share the identity {id:?}"
        );
    }
}

/// The environment a plugin started with, as the kernel recorded it at exec (a shell adds
/// variables of its own to what `env` prints).
async fn environment_seen_by(config: ExecConfig, dump: &Path) -> BTreeMap<String, String> {
    ExecProvider::new(config)
        .fetch_for(&req("a"))
        .await
        .unwrap();
    std::fs::read(dump)
        .unwrap()
        .split(|b| *b == 0)
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

#[tokio::test]
async fn the_plugin_sees_exactly_the_environment_the_rule_gives() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("environ");
    let command = plugin(
        dir.path(),
        &format!("cat /proc/$$/environ > {}\n{TOKEN_OUT}", dump.display()),
    );
    let parent: BTreeMap<String, String> = std::env::vars().collect();
    // `cargo test` runs tests with CARGO_* set: none is on the default list.
    assert!(parent.keys().any(|k| k.starts_with("CARGO_")), "{parent:?}");
    let allowed = |name: &str, patterns: &[&str]| {
        DEFAULT_EXEC_PASS_ENV
            .iter()
            .chain(patterns)
            .any(|p| match p.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == *p,
            })
    };
    let expect = |patterns: &[&str], everything: bool| {
        let mut want: BTreeMap<String, String> = parent
            .iter()
            .filter(|(k, _)| everything || allowed(k, patterns))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        want.insert("PLUGIN_MODE".into(), "test".into());
        want.insert(
            "KUBERNETES_EXEC_INFO".into(),
            ExecProvider::new(config(
                command.clone(),
                EXEC_API_V1,
                Duration::from_secs(10),
            ))
            .exec_info(&req("a")),
        );
        want
    };

    // By default: the short allowlist, then `env`, then KUBERNETES_EXEC_INFO.
    let base = config(command.clone(), EXEC_API_V1, Duration::from_secs(10));
    let seen = environment_seen_by(base.clone(), &dump).await;
    assert_eq!(seen, expect(&[], false));
    assert!(seen.contains_key("PATH"), "{seen:?}");
    assert!(!seen.keys().any(|k| k.starts_with("CARGO_")), "{seen:?}");

    // passEnv adds names and prefixes.
    let mut with_pass = base.clone();
    with_pass.pass_env = vec!["CARGO_PKG_*".into(), "CARGO_MANIFEST_DIR".into()];
    let seen = environment_seen_by(with_pass, &dump).await;
    assert_eq!(seen, expect(&["CARGO_PKG_*", "CARGO_MANIFEST_DIR"], false));
    assert!(seen.contains_key("CARGO_MANIFEST_DIR"), "{seen:?}");

    // inheritEnv: true passes everything, as before.
    let mut everything = base;
    everything.inherit_env = true;
    assert_eq!(
        environment_seen_by(everything, &dump).await,
        expect(&[], true)
    );
}

#[test]
fn identity_is_server_plus_config() {
    let p = provider(
        PathBuf::from("/bin/true"),
        EXEC_API_V1,
        Duration::from_secs(1),
    );
    let a = p.key_for(&req("a")).unwrap();
    assert_eq!(a, p.key_for(&req("a")).unwrap());
    assert_ne!(a, p.key_for(&req("b")).unwrap());
    let mut other_server = req("a");
    other_server.cluster.as_mut().unwrap().server = "https://elsewhere".into();
    assert_ne!(a, p.key_for(&other_server).unwrap());
    // Key order in the config does not matter.
    let mut reordered = serde_json::Map::new();
    reordered.insert("port".into(), 443.into());
    reordered.insert("clusterName".into(), "a".into());
    let mut r = req("a");
    r.cluster.as_mut().unwrap().config = reordered.into();
    assert_eq!(a, p.key_for(&r).unwrap());
    // The key stays small whatever the extension holds (ListEntries shows every key).
    let mut big = req("a");
    let cluster = big.cluster.as_mut().unwrap();
    let mut config = cluster.config.fields().clone();
    config.insert("blob".into(), "x".repeat(16 * 1024).into());
    cluster.config = config.into();
    let id = p.key_for(&big).unwrap();
    assert!(id.len() < 128, "{} bytes: {id:.80}", id.len());
    assert!(id.starts_with("https://"), "{id}");
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    fn status_field() -> impl Strategy<Value = Option<serde_json::Value>> {
        prop_oneof![
            Just(None),
            Just(Some(Value::Null)),
            any::<i64>().prop_map(|n| Some(Value::from(n))),
            "[ -~]{0,12}".prop_map(|s| Some(Value::from(s))),
        ]
    }

    proptest! {
        /// Whatever a plugin prints, parsing never panics, and no error quotes the token.
        #[test]
        fn errors_never_quote_the_secret(
            secret in "SECRET[A-Za-z0-9]{8,24}",
            api in prop_oneof![Just(EXEC_API_V1), Just(EXEC_API_V1BETA1), Just("v9")],
            kind in prop_oneof![Just("ExecCredential"), Just("Pod")],
            where_secret in 0usize..3,
            other in status_field(),
            expiry in status_field(),
            truncate in any::<Option<usize>>(),
        ) {
            let mut status = serde_json::Map::new();
            let keys = ["token", "clientKeyData", "clientCertificateData"];
            status.insert(keys[where_secret].into(), Value::from(secret.clone()));
            if let Some(v) = other {
                status.insert(keys[(where_secret + 1) % 3].into(), v);
            }
            if let Some(v) = expiry {
                status.insert("expirationTimestamp".into(), v);
            }
            let mut text = json!({"apiVersion": api, "kind": kind, "status": status}).to_string();
            if let Some(cut) = truncate {
                text.truncate(cut % (text.len() + 1));
            }
            if let Err(e) = parse_exec_credential(text.as_bytes(), Duration::from_secs(60)) {
                prop_assert!(!e.contains(&secret), "{e}");
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_exec_credential(&bytes, Duration::from_secs(60));
        }
    }
}

/// serde_json keeps an integer past 64 bits as an f64, so two clusters that differ only in
/// one would render alike: the text the plugin is shown decides their keys apart.
#[test]
fn integers_past_64_bits_keep_clusters_apart() {
    let p = provider(
        PathBuf::from("/bin/true"),
        EXEC_API_V1,
        Duration::from_secs(1),
    );
    let with = |text: &str| {
        let mut r = req("a");
        r.cluster.as_mut().unwrap().config = crate::request::ClusterConfig::parse(
            text.to_owned(),
            &crate::config::LimitsConfig::default(),
        )
        .unwrap();
        p.key_for(&r).unwrap()
    };
    let one = with(r#"{"clusterName":"a","id":18446744073709551617}"#);
    let two = with(r#"{"clusterName":"a","id":18446744073709551618}"#);
    assert_ne!(one, two, "two clusters shared one key");
    assert_eq!(
        one,
        with(r#"{"clusterName":"a","id":18446744073709551617}"#)
    );
    // Exact numbers keep the key independent of key order.
    assert_eq!(
        with(r#"{"clusterName":"a","port":443}"#),
        with(r#"{"port":443,"clusterName":"a"}"#)
    );
}
