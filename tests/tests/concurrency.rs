//! Single flight: many concurrent misses for one cache key → one upstream (plugin) run.

use std::time::Duration;

use credbroker_tests::{
    Broker, ExecPlugin, PluginOptions, SHIM_TIMEOUT, V1, assert_credential, config_yaml, exec_info,
    exec_provider, spawn_shim,
};
use serde_json::json;

const CALLERS: usize = 200;

#[test]
fn concurrent_cold_misses_run_the_plugin_once() {
    let plugin = ExecPlugin::with(PluginOptions {
        sleep: Duration::from_millis(500),
        expires_in: Some(Duration::from_secs(3600)),
        ..PluginOptions::default()
    });
    let broker = Broker::start(&config_yaml(&[exec_provider(
        "onprem",
        plugin.command(),
        "",
    )]));
    let info = exec_info(V1, "https://cold.example", json!({"clusterName": "cold"}));

    let shims: Vec<_> = (0..CALLERS)
        .map(|_| spawn_shim(broker.socket(), &["--provider", "onprem"], Some(&info)))
        .collect();
    let outputs: Vec<_> = shims.into_iter().map(|s| s.wait(SHIM_TIMEOUT)).collect();

    let mut failures = 0;
    for (i, out) in outputs.iter().enumerate() {
        if !out.status.success() {
            failures += 1;
            if failures <= 3 {
                eprintln!("shim #{i} failed: {}", credbroker_tests::describe(out));
            }
        }
    }
    assert_eq!(
        failures, 0,
        "{failures} of {CALLERS} shims failed (first ones above)"
    );
    let tokens: Vec<String> = outputs
        .iter()
        .map(|out| assert_credential(out, V1).token)
        .collect();
    assert!(
        tokens.iter().all(|t| t == "tok-cold-1"),
        "every caller should get the one token from run 1, got {:?}",
        tokens.iter().collect::<std::collections::BTreeSet<_>>()
    );
    assert_eq!(
        plugin.runs(),
        1,
        "{CALLERS} concurrent misses should run the plugin once; broker log:\n{}",
        broker.logs()
    );
}
