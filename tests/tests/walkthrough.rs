//! The README's walk-through, step by step, on the config and exec info it ships
//! (`examples/demo/`), moved from /tmp/credbroker-demo into a temp dir.

use std::path::PathBuf;

use credbroker_tests::{
    Broker, V1, assert_credential, assert_shim_error, describe, run_broker_cli, run_shim, tempdir,
};

fn demo(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/demo")
        .join(file)
}

#[test]
fn the_readme_walkthrough_works() {
    let out = run_broker_cli(&["check-config".as_ref(), demo("credbroker.yaml").as_os_str()]);
    assert!(out.status.success(), "{}", describe(&out));

    let root = tempdir();
    let config = std::fs::read_to_string(demo("credbroker.yaml"))
        .unwrap()
        .replace("/tmp/credbroker-demo", root.path().to_str().unwrap());
    std::fs::create_dir_all(root.path().join("tokens/dev")).unwrap();
    std::fs::write(root.path().join("tokens/dev/token"), "my-dev-token\n").unwrap();
    let broker = Broker::start_at(&config, &root.path().join("broker.sock"));
    let info = std::fs::read_to_string(demo("exec-info.json")).unwrap();

    let out = run_shim(broker.socket(), &["--provider", "static"], Some(&info));
    assert_eq!(assert_credential(&out, V1).token, "my-dev-token");

    let first = assert_credential(
        &run_shim(broker.socket(), &["--provider", "wrapped"], Some(&info)),
        V1,
    );
    assert!(
        first.token.starts_with("demo-issued-at-"),
        "{}",
        first.token
    );
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let second = assert_credential(
        &run_shim(broker.socket(), &["--provider", "wrapped"], Some(&info)),
        V1,
    );
    assert_eq!(
        second.token, first.token,
        "the second run is served from the cache"
    );

    let out = run_shim(broker.socket(), &["--provider", "nope"], Some(&info));
    assert_shim_error(&out, &["unknown provider \"nope\""]);

    let logs = broker.logs();
    assert!(logs.contains("outcome=Hit"), "{logs}");
    assert!(
        !logs.contains("my-dev-token"),
        "the token must not be logged: {logs}"
    );
}
