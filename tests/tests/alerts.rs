//! The shipped alert rules (deploy/kueue/components/credbroker-metrics/prometheusrule.yaml)
//! run by Prometheus's own `promtool` on what a running broker exports. `promtool check
//! rules` checks the PrometheusRule's groups; then each scenario drives a broker of its own
//! into a condition round after round, scrapes its real `/metrics` after every round, and
//! `promtool test rules` gets those scrapes as series one scrape interval apart (a round
//! stands for a minute of the condition), with every alert that must be firing, and every
//! alert that must be pending (its expression true, its `for` not yet over), at given times.
//! Every other alert must be neither, so each scenario is also every other alert's case of
//! not firing. Every alert of the file must fire in some scenario and be pending before it.

use std::collections::BTreeSet;
use std::time::Duration;

use credbroker_proto::v1::RefreshRequest;
use credbroker_proto::v1::admin_service_client::AdminServiceClient;
use credbroker_tests::alerts::{INTERVAL_MINUTES, NAMESPACE, Rules, Scrapes, TestGroup, samples};
use credbroker_tests::modal_plugin::{ModalPlugin, Mode};
use credbroker_tests::{
    Broker, ExecPlugin, FakeApiServer, SHIM_RUN_ENV, TokenFiles, V1, assert_credential, cluster,
    config_yaml, exec_provider, file_provider, get_token_blocking, scrape_metrics, shim_command,
    unix_channel, wait_until,
};
use serde_json::{Value, json};

const METRICS: &str = "metrics: {address: \"127.0.0.1:0\"}\n";

/// An alert and its `by` labels besides `namespace` and `pod`.
type Alert = (&'static str, Vec<(&'static str, String)>);

/// What must hold at one minute of a scenario's series.
struct At {
    minute: u32,
    firing: Vec<Alert>,
    pending: Vec<Alert>,
}

/// promtool's test group for `scrapes`: at each [`At`], its firing alerts and no other,
/// and its pending alerts and no other.
fn group(rules: &Rules, name: &str, scrapes: &Scrapes, at: &[At]) -> TestGroup {
    let last = u32::try_from(scrapes.len()).expect("rounds") - 1;
    let target = |labels: &[(&'static str, String)]| -> Vec<(&'static str, String)> {
        let mut all = vec![
            ("namespace", NAMESPACE.to_owned()),
            ("pod", scrapes.pod().to_owned()),
        ];
        all.extend(labels.iter().cloned());
        all
    };
    let mut cases = Vec::new();
    let mut exprs = Vec::new();
    for at in at {
        assert!(
            at.minute <= last * INTERVAL_MINUTES,
            "{name}: minute {} is past the last scrape",
            at.minute
        );
        for alert in rules.alert_names() {
            let expected: Vec<Value> = at
                .firing
                .iter()
                .filter(|(a, _)| *a == alert)
                .map(|(a, labels)| {
                    let all = target(labels);
                    let borrowed: Vec<(&str, &str)> =
                        all.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    rules.firing(a, &borrowed)
                })
                .collect();
            cases.push((at.minute, alert, expected));
        }
        // ALERTS holds pending alerts with their labels (the rule's own included).
        let pending: Vec<Value> = at
            .pending
            .iter()
            .map(|(a, labels)| {
                let all = target(labels);
                let borrowed: Vec<(&str, &str)> =
                    all.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let exp = rules.firing(a, &borrowed);
                let mut selector: Vec<String> = vec![
                    format!("alertname=\"{a}\""),
                    "alertstate=\"pending\"".to_owned(),
                ];
                for (k, v) in exp["exp_labels"].as_object().expect("labels") {
                    selector.push(format!("{k}={v}"));
                }
                json!({"labels": format!("ALERTS{{{}}}", selector.join(",")), "value": 1})
            })
            .collect();
        exprs.push((
            at.minute,
            "ALERTS{alertstate=\"pending\"}".to_owned(),
            pending,
        ));
    }
    TestGroup {
        name: name.to_owned(),
        input_series: scrapes.input_series(),
        cases,
        exprs,
    }
}

fn at(minute: u32, firing: &[&Alert], pending: &[&Alert]) -> At {
    let owned = |alerts: &[&Alert]| alerts.iter().map(|a| (*a).clone()).collect();
    At {
        minute,
        firing: owned(firing),
        pending: owned(pending),
    }
}

fn alert(name: &'static str, labels: &[(&'static str, &str)]) -> Alert {
    (
        name,
        labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
    )
}

/// The one gRPC status code other than OK among `provider`'s GetToken calls.
fn failure_code(scrapes: &Scrapes, provider: &str) -> String {
    let prefix = format!("credbroker_requests_total{{provider=\"{provider}\",code=\"");
    let codes: Vec<String> = scrapes
        .last()
        .expect("a scrape")
        .keys()
        .filter_map(|s| s.strip_prefix(&prefix)?.strip_suffix("\"}"))
        .filter(|c| *c != "OK")
        .map(str::to_owned)
        .collect();
    assert_eq!(codes.len(), 1, "{}: {codes:?}", scrapes.pod());
    codes[0].clone()
}

/// Upstream calls failing: for provider `half` one call in two fails (exactly half: not
/// "most"), for `most` two in three. Each failing call is a new cluster's, so each is an
/// upstream call, and each GetToken for it fails.
fn upstream_failures(rules: &Rules) -> TestGroup {
    const ROUNDS: u32 = 22;
    let (half, most) = (TokenFiles::new(), TokenFiles::new());
    let broker = Broker::start(
        &(config_yaml(&[
            file_provider("half", &half.template()),
            file_provider("most", &most.template()),
        ]) + METRICS),
    );
    let mut scrapes = Scrapes::new(
        &broker.metrics_address(),
        "kueue-controller-manager-upstream",
    );
    for round in 0..ROUNDS {
        for (provider, files, failing) in [("half", &half, 1), ("most", &most, 2)] {
            let ok = format!("ok-{round}");
            files.write(&ok, "a-token");
            let answer = get_token_blocking(
                broker.socket(),
                provider,
                cluster("https://k8s.example", &json!({"clusterName": ok})),
            );
            assert!(answer.is_ok(), "{provider} {ok}: {answer:?}");
            for i in 0..failing {
                let gone = format!("gone-{round}-{i}");
                let answer = get_token_blocking(
                    broker.socket(),
                    provider,
                    cluster("https://k8s.example", &json!({"clusterName": gone})),
                );
                assert!(answer.is_err(), "{provider} {gone}: {answer:?}");
            }
        }
        scrapes.scrape();
    }
    let half_code = failure_code(&scrapes, "half");
    let most_code = failure_code(&scrapes, "most");
    let failing = |provider: &str, code: &str| {
        alert(
            "CredbrokerTokenRequestsFailing",
            &[("provider", provider), ("code", code)],
        )
    };
    let alerts = [
        failing("half", &half_code),
        failing("most", &most_code),
        alert("CredbrokerUpstreamFailing", &[("provider", "most")]),
    ];
    let all: Vec<&Alert> = alerts.iter().collect();
    // Each alert's expression holds from the second scrape (minute 1) on: pending until its
    // `for` is over (15 minutes), firing from then.
    group(
        rules,
        "upstream failures",
        &scrapes,
        &[
            at(15, &[], &all),
            at(16, &all, &[]),
            at(ROUNDS - 1, &all, &[]),
        ],
    )
}

/// A caller over its rate limit every round (with the calls that got through): refused
/// calls are RESOURCE_EXHAUSTED, which is no failing GetToken.
fn rate_limited(rules: &Rules) -> TestGroup {
    const ROUNDS: u32 = 16;
    let tokens = TokenFiles::new();
    tokens.write("lab", "a-token");
    let broker = Broker::start(
        &(config_yaml(&[file_provider("onprem", &tokens.template())])
            + METRICS
            + "rateLimit: {perSecond: 1, burst: 2}\n"),
    );
    let mut scrapes = Scrapes::new(
        &broker.metrics_address(),
        "kueue-controller-manager-limited",
    );
    for round in 0..ROUNDS {
        let refused = (0..5).any(|_| {
            match get_token_blocking(
                broker.socket(),
                "onprem",
                cluster("https://k8s.example", &json!({"clusterName": "lab"})),
            ) {
                Ok(_) => false,
                Err(status) if status.code() == tonic::Code::ResourceExhausted => true,
                Err(status) => panic!("round {round}: {status:?}"),
            }
        });
        assert!(refused, "round {round}: no call met the rate limit");
        scrapes.scrape();
    }
    let limited = alert("CredbrokerCallersRateLimited", &[]);
    group(
        rules,
        "rate limited",
        &scrapes,
        &[
            at(10, &[], &[&limited]),
            at(11, &[&limited], &[]),
            at(ROUNDS - 1, &[&limited], &[]),
        ],
    )
}

/// The upstream goes down under a held credential: once past its refresh time, every round
/// a caller is served it stale, and a background refresh fails (an operator's
/// AdminService/Refresh, one per round: the broker's own would back off).
fn stale_serving(rules: &Rules) -> TestGroup {
    // `for: 30m`, and 3 to spare.
    const ROUNDS: u32 = 34;
    // 90 s tokens: refreshed from 36–54 s, served until 67.5 s (a quarter-lifetime margin):
    // at least 13.5 s for the rounds, which take 0.1–0.4 s each (a plugin run and scrapes).
    let plugin = ModalPlugin::new(90, 90);
    let broker = Broker::start(
        &(config_yaml(&[exec_provider("onprem", &plugin.command(), "timeout: 5s")]) + METRICS),
    );
    let address = broker.metrics_address();
    let get = || {
        get_token_blocking(
            broker.socket(),
            "onprem",
            cluster("https://k8s.example", &json!({"clusterName": "lab"})),
        )
    };
    let stale = r#"credbroker_cache_stale_served_total{provider="onprem"}"#;
    let failures = r#"credbroker_refresh_failures_total{provider="onprem"}"#;
    assert!(get().is_ok());
    plugin.set(Mode::Fail);
    let became_stale = wait_until(Duration::from_secs(70), || {
        assert!(get().is_ok(), "the held credential stays in service");
        samples(&scrape_metrics(&address)).contains_key(stale)
    });
    assert!(became_stale, "no call was served stale:\n{}", broker.logs());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut admin =
        rt.block_on(async { AdminServiceClient::new(unix_channel(broker.socket()).await) });
    let mut scrapes = Scrapes::new(&address, "kueue-controller-manager-stale");
    let mut before = (0.0, 0.0);
    for round in 0..ROUNDS {
        let served = get();
        assert!(
            served.is_ok(),
            "round {round}: the stale credential is no longer served (past 67.5 s?): {served:?}"
        );
        let refreshed = rt
            .block_on(admin.refresh(RefreshRequest {
                provider: "onprem".into(),
                identity: String::new(),
                all: false,
            }))
            .expect("AdminService/Refresh")
            .into_inner();
        assert_eq!(refreshed.failed, 1, "round {round}: {refreshed:?}");
        let now = scrapes.scrape();
        let counts = (now[stale], now[failures]);
        assert!(
            counts.0 > before.0 && counts.1 > before.1,
            "round {round}: served stale and a failed refresh counted: {before:?} then {counts:?}"
        );
        before = counts;
    }
    let onprem = |name| alert(name, &[("provider", "onprem")]);
    let near_expiry = onprem("CredbrokerEntriesNearExpiry");
    let upstream = onprem("CredbrokerUpstreamFailing");
    let stale = onprem("CredbrokerServingStale");
    let all = [&near_expiry, &upstream, &stale];
    // for: 10m, 15m and 30m.
    group(
        rules,
        "stale serving",
        &scrapes,
        &[
            at(10, &[], &all),
            at(11, &[&near_expiry], &[&upstream, &stale]),
            at(15, &[&near_expiry], &[&upstream, &stale]),
            at(16, &[&near_expiry, &upstream], &[&stale]),
            at(30, &[&near_expiry, &upstream], &[&stale]),
            at(31, &all, &[]),
            at(ROUNDS - 1, &all, &[]),
        ],
    )
}

/// Callers asking again before their come-back time, every round: for provider `fine` the
/// API server accepts the credential (a second authenticator, a re-executed kubectl), for
/// `revoked` it answers 401 (a confirmed rejection). Each round asks for a new cluster, so
/// each re-ask is checked.
fn reasks(rules: &Rules) -> TestGroup {
    // `for: 30m`, and 4 to spare.
    const ROUNDS: u32 = 36;
    let plugin = ExecPlugin::new();
    let broker = Broker::start(
        &(config_yaml(&[
            exec_provider("fine", plugin.command(), ""),
            exec_provider("revoked", plugin.command(), ""),
        ]) + METRICS),
    );
    let server = FakeApiServer::start_at(&[], 31);
    let ca = base64_ca(server.ca_pem());
    // Runs the shim as the same caller each time (this test process, as in
    // tests/tests/rejections.rs): its second run is a re-ask.
    let ask = |provider: &str, cluster: &str| {
        let info = json!({
            "apiVersion": V1,
            "kind": "ExecCredential",
            "spec": {"interactive": false, "cluster": {
                "server": server.url(),
                "certificate-authority-data": ca,
                "config": {"clusterName": cluster},
            }},
        })
        .to_string();
        let mut cmd = shim_command(broker.socket(), &["--provider", provider], Some(&info));
        cmd.env_remove(SHIM_RUN_ENV);
        let out = credbroker_tests::Running::spawn(&mut cmd).wait(Duration::from_secs(45));
        assert_credential(&out, V1).token
    };
    let mut scrapes = Scrapes::new(&broker.metrics_address(), "kueue-controller-manager-reasks");
    let accepted = r#"credbroker_reask_checks_total{provider="fine",answer="accepted"}"#;
    let rejected = r#"credbroker_reask_checks_total{provider="revoked",answer="rejected"}"#;
    for round in 0..ROUNDS {
        let fine = format!("fine-{round}");
        let token = ask("fine", &fine);
        server.accept(&token);
        assert_eq!(ask("fine", &fine), token, "an accepted credential is kept");
        let revoked = format!("revoked-{round}");
        let token = ask("revoked", &revoked);
        assert_ne!(
            ask("revoked", &revoked),
            token,
            "a rejected one is replaced"
        );
        let now = scrapes.scrape();
        let want = f64::from(round + 1);
        assert_eq!(
            (now.get(accepted), now.get(rejected)),
            (Some(&want), Some(&want)),
            "round {round}: {now:?}\n{:?}",
            server.reviews()
        );
        assert!(
            !now.keys()
                .any(|s| s.contains(r#"provider="fine",answer="rejected""#)),
            "{now:?}"
        );
    }
    let rejected = alert("CredbrokerCredentialsRejected", &[("provider", "revoked")]);
    group(
        rules,
        "re-asks",
        &scrapes,
        &[
            at(30, &[], &[&rejected]),
            at(31, &[&rejected], &[]),
            at(ROUNDS - 1, &[&rejected], &[]),
        ],
    )
}

fn base64_ca(pem: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(pem)
}

#[test]
fn every_alert_fires_on_what_it_is_about_and_on_nothing_else() {
    let rules = Rules::from_deploy();
    let groups: Vec<TestGroup> = std::thread::scope(|s| {
        let scenarios: Vec<fn(&Rules) -> TestGroup> =
            vec![upstream_failures, rate_limited, stale_serving, reasks];
        let running: Vec<_> = scenarios
            .into_iter()
            .map(|scenario| {
                let rules = &rules;
                s.spawn(move || {
                    let started = std::time::Instant::now();
                    let group = scenario(rules);
                    println!("{}: {:.1?}", group.name, started.elapsed());
                    group
                })
            })
            .collect();
        running
            .into_iter()
            .map(|r| r.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    // Every alert fires somewhere and is pending (not firing) before: none is left without
    // a case (a new alert needs a scenario here).
    let named = |select: fn(&TestGroup) -> Vec<String>| -> BTreeSet<String> {
        groups.iter().flat_map(select).collect()
    };
    let fired = named(|g| {
        g.cases
            .iter()
            .filter(|(_, _, exp)| !exp.is_empty())
            .map(|(_, a, _)| a.clone())
            .collect()
    });
    let pending = named(|g| {
        g.exprs
            .iter()
            .flat_map(|(_, _, exp)| exp.iter())
            .filter_map(|e| {
                let labels = e["labels"].as_str()?;
                let rest = labels.split_once("alertname=\"")?.1;
                Some(rest.split_once('"')?.0.to_owned())
            })
            .collect()
    });
    assert_eq!(fired, rules.alert_names(), "alerts some scenario fires");
    assert_eq!(
        pending,
        rules.alert_names(),
        "alerts some scenario has pending"
    );
    rules.test(&groups);
    println!(
        "promtool: {} alerts, {} scenarios passed ({})",
        rules.alert_names().len(),
        groups.len(),
        rules.dir().display()
    );
}
