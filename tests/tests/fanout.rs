//! Upstream fan-out is capped: 600 concurrent GetToken calls for 600 distinct clusters run
//! the exec plugin at most `cache.maxConcurrentFetches` copies at a time, and every call
//! still succeeds (issue 12, item 4).

use std::path::{Path, PathBuf};

use credbroker_proto::v1::token_service_client::TokenServiceClient;
use credbroker_proto::v1::{Cluster, GetTokenRequest};
use credbroker_tests::{Broker, config_yaml, exec_provider, sh_quote, tempdir, unix_channel};

const CALLS: usize = 600;
const CAP: usize = 12;
/// Connections the calls are spread over (as many shims would open).
const CONNECTIONS: usize = 12;

/// A plain-sh plugin (no interpreter start-up, so 600 runs stay cheap) that marks itself
/// running with an atomic `mkdir`, records how many copies are running (a shell glob, no
/// fork), works a little,
/// and unmarks itself.
fn counting_plugin(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let running = dir.join("running");
    std::fs::create_dir(&running).expect("create running dir");
    let script = format!(
        r#"#!/bin/sh
set -eu
running={running}
mkdir "$running/$$"
set -- "$running"/*
echo $# >> {seen}
sleep 0.02
rmdir "$running/$$"
printf '{{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{{"token":"tok-%s"}}}}\n' "$$"
"#,
        running = sh_quote(running.to_str().expect("UTF-8 temp dir")),
        seen = sh_quote(dir.join("seen").to_str().expect("UTF-8 temp dir")),
    );
    let command = dir.join("plugin.sh");
    std::fs::write(&command, script).expect("write plugin");
    std::fs::set_permissions(&command, std::fs::Permissions::from_mode(0o755))
        .expect("chmod plugin");
    command
}

fn cluster(i: usize) -> Cluster {
    use prost_types::value::Kind;
    let config = prost_types::Struct {
        fields: [(
            "clusterName".to_owned(),
            prost_types::Value {
                kind: Some(Kind::StringValue(format!("c{i}"))),
            },
        )]
        .into_iter()
        .collect(),
    };
    Cluster {
        server: format!("https://c{i}.example"),
        config: Some(config),
        ..Cluster::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_distinct_misses_run_at_most_the_cap_of_plugins() {
    let plugin_dir = tempdir();
    let command = counting_plugin(plugin_dir.path());
    let config = config_yaml(&[exec_provider("onprem", &command, "")]).replace(
        "providers:\n",
        &format!("cache: {{maxConcurrentFetches: {CAP}}}\nproviders:\n"),
    );
    let broker = Broker::start(&config);

    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(TokenServiceClient::new(unix_channel(broker.socket()).await));
    }
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let mut client = clients[i % CONNECTIONS].clone();
            tokio::spawn(async move {
                client
                    .get_token(GetTokenRequest {
                        provider: "onprem".to_owned(),
                        cluster: Some(cluster(i)),
                        interactive: false,
                        caller: None,
                    })
                    .await
            })
        })
        .collect();
    let mut failures = Vec::new();
    for (i, call) in calls.into_iter().enumerate() {
        match call.await.expect("call task") {
            Ok(response) => assert!(response.into_inner().token.starts_with("tok-")),
            Err(status) => failures.push(format!("call {i}: {status}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {CALLS} calls failed, first: {:?}; broker log:\n{}",
        failures.len(),
        &failures[..failures.len().min(3)],
        broker.logs()
    );

    let seen = std::fs::read_to_string(plugin_dir.path().join("seen")).expect("plugin ran");
    let counts: Vec<usize> = seen
        .lines()
        .map(|l| l.trim().parse().expect("a count"))
        .collect();
    assert_eq!(counts.len(), CALLS, "one plugin run per distinct cluster");
    let max = counts.iter().copied().max().unwrap_or(0);
    assert!(
        max <= CAP,
        "{max} plugin copies ran at once, over cache.maxConcurrentFetches = {CAP}"
    );
    assert!(max >= 2, "the calls did run concurrently (max {max})");
    let leftover = std::fs::read_dir(plugin_dir.path().join("running"))
        .expect("running dir")
        .count();
    assert_eq!(leftover, 0, "every plugin run finished");
}
