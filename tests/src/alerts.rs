//! The deploy's Prometheus alert rules, run by Prometheus's own `promtool` on series scraped
//! from a running broker. [`Rules::from_deploy`] takes `spec.groups` out of the shipped
//! PrometheusRule into a plain rules file and has `promtool check rules` check it; a test
//! scrapes the broker's `/metrics` once per round ([`Scrapes`]), turns the scrapes into
//! `input_series` one scrape interval apart, and [`Rules::test`] runs `promtool test rules`
//! with the alerts it expects at given times (none: `exp_alerts: []`). promtool's output is
//! the failure message.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::{COMMAND_TIMEOUT, describe, require_tool, run, scrape_metrics, tempdir};

/// The shipped rules, relative to the workspace root.
pub const PROMETHEUS_RULE: &str = "deploy/kueue/components/credbroker-metrics/prometheusrule.yaml";
/// The namespace the deploy puts the broker in (the Kueue manager's); Prometheus Operator's
/// PodMonitor adds it to every scraped series as `namespace`, beside `pod`.
pub const NAMESPACE: &str = "kueue-system";
/// The time between two scrapes in the series given to promtool, and between its rule
/// evaluations: Prometheus's default scrape interval. Each round of a test is one scrape, so
/// a round stands for one interval in which what the round did kept happening.
pub const INTERVAL_MINUTES: u32 = 1;

/// The shipped alert rules, as a plain rules file that `promtool check rules` accepted.
#[derive(Debug)]
pub struct Rules {
    dir: TempDir,
    /// Each alert's rule (`alert`, `expr`, `for`, `labels`, `annotations`), by name.
    alerts: BTreeMap<String, Value>,
}

impl Rules {
    /// [`PROMETHEUS_RULE`]'s `spec.groups`, written to a rules file and checked with
    /// `promtool check rules`; panics with promtool's output if it refuses them.
    pub fn from_deploy() -> Rules {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(PROMETHEUS_RULE);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let doc: Value =
            serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(doc["kind"], "PrometheusRule", "{}", path.display());
        let groups = doc["spec"]["groups"].clone();
        let mut alerts = BTreeMap::new();
        for rule in groups
            .as_array()
            .unwrap_or_else(|| panic!("{}: no spec.groups", path.display()))
            .iter()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        {
            if let Some(name) = rule["alert"].as_str() {
                let previous = alerts.insert(name.to_owned(), rule.clone());
                assert!(previous.is_none(), "{}: two alerts {name}", path.display());
            }
        }
        let dir = tempdir();
        // JSON is YAML: promtool reads it as written.
        std::fs::write(
            dir.path().join("rules.yaml"),
            json!({ "groups": groups }).to_string(),
        )
        .expect("write the rules file");
        let out = promtool(dir.path(), &["check", "rules", "rules.yaml"]);
        assert!(
            out.status.success(),
            "promtool check rules on {PROMETHEUS_RULE}'s spec.groups:\n{}",
            describe(&out)
        );
        Rules { dir, alerts }
    }

    /// The names of every alert in the rules.
    pub fn alert_names(&self) -> BTreeSet<String> {
        self.alerts.keys().cloned().collect()
    }

    /// The alert `name` as promtool's `exp_alerts` lists it when it fires for a series
    /// with `labels` (its `by` labels): those labels and the rule's own, and the rule's
    /// annotations with each `{{ $labels.NAME }}` filled in. Panics when an annotation reads
    /// a label that is not among them (Prometheus would print `<no value>`).
    pub fn firing(&self, name: &str, labels: &[(&str, &str)]) -> Value {
        let rule = self
            .alerts
            .get(name)
            .unwrap_or_else(|| panic!("no alert {name} in {PROMETHEUS_RULE}"));
        let mut all: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        for (k, v) in rule["labels"].as_object().into_iter().flatten() {
            all.insert(
                k.clone(),
                v.as_str().expect("label values are strings").to_owned(),
            );
        }
        let mut annotations = BTreeMap::new();
        for (k, v) in rule["annotations"].as_object().into_iter().flatten() {
            let mut text = v.as_str().expect("annotations are strings").to_owned();
            while let Some(start) = text.find("{{ $labels.") {
                let rest = &text[start + "{{ $labels.".len()..];
                let (label, _) = rest
                    .split_once(" }}")
                    .unwrap_or_else(|| panic!("{name}: unclosed template in {v}"));
                let value = all.get(label).unwrap_or_else(|| {
                    panic!("{name}: annotation {k} reads $labels.{label}, not among {all:?}")
                });
                text = format!(
                    "{}{value}{}",
                    &text[..start],
                    &rest[label.len() + " }}".len()..]
                );
            }
            annotations.insert(k.clone(), text);
        }
        json!({"exp_labels": all, "exp_annotations": annotations})
    }

    /// Runs `promtool test rules` on `groups`; panics with promtool's output if a case
    /// fails.
    pub fn test(&self, groups: &[TestGroup]) {
        let tests = json!({
            "rule_files": ["rules.yaml"],
            "evaluation_interval": format!("{INTERVAL_MINUTES}m"),
            "tests": groups.iter().map(TestGroup::to_json).collect::<Vec<_>>(),
        });
        let path = self.dir.path().join("tests.yaml");
        std::fs::write(&path, serde_json::to_string_pretty(&tests).expect("JSON"))
            .expect("write the test file");
        let out = promtool(self.dir.path(), &["test", "rules", "tests.yaml"]);
        assert!(
            out.status.success(),
            "promtool test rules ({}):\n{}",
            path.display(),
            describe(&out)
        );
    }

    /// The rules directory (rules.yaml, and tests.yaml once [`Rules::test`] ran): kept
    /// while `self` lives.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }
}

/// Runs `promtool ARGS` in `dir` (bounded); fails the test if promtool is missing.
fn promtool(dir: &Path, args: &[&str]) -> std::process::Output {
    let promtool = require_tool(
        "promtool",
        "scripts/test.sh installs it from Debian's prometheus package",
    );
    run(
        Command::new(promtool).current_dir(dir).args(args),
        COMMAND_TIMEOUT,
    )
}

/// The samples of one `/metrics` response (status line and headers included): series text
/// (`name{labels}`, as the exposition writes it) to value.
pub fn samples(response: &str) -> BTreeMap<String, f64> {
    let body = response.split_once("\r\n\r\n").map_or(response, |(_, b)| b);
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("not a sample: {line:?}"));
            let value = value
                .parse()
                .unwrap_or_else(|e| panic!("sample {line:?}: {e}"));
            (series.to_owned(), value)
        })
        .collect()
}

/// One broker's `/metrics`, scraped once per round, as Prometheus Operator's PodMonitor
/// sees it from the pod `pod` in [`NAMESPACE`].
#[derive(Debug)]
pub struct Scrapes {
    address: String,
    pod: String,
    taken: Vec<BTreeMap<String, f64>>,
}

impl Scrapes {
    /// No scrape yet of the metrics endpoint at `address`.
    pub fn new(address: &str, pod: &str) -> Scrapes {
        Scrapes {
            address: address.to_owned(),
            pod: pod.to_owned(),
            taken: Vec::new(),
        }
    }

    /// Scrapes once more; returns that scrape's samples.
    pub fn scrape(&mut self) -> &BTreeMap<String, f64> {
        self.taken.push(samples(&scrape_metrics(&self.address)));
        self.taken.last().expect("just pushed")
    }

    /// The last scrape's samples.
    pub fn last(&self) -> Option<&BTreeMap<String, f64>> {
        self.taken.last()
    }

    /// The scrapes taken so far.
    pub fn len(&self) -> usize {
        self.taken.len()
    }

    pub fn is_empty(&self) -> bool {
        self.taken.is_empty()
    }

    /// The pod label of the series.
    pub fn pod(&self) -> &str {
        &self.pod
    }

    /// promtool's `input_series`: every series any scrape holds, with the `namespace` and
    /// `pod` labels the PodMonitor adds, its values one per scrape (`_` where a scrape did
    /// not have it: a series is created when first counted).
    pub fn input_series(&self) -> Vec<Value> {
        let names: BTreeSet<&String> = self.taken.iter().flat_map(BTreeMap::keys).collect();
        names
            .into_iter()
            .map(|series| {
                let target = format!("namespace=\"{NAMESPACE}\",pod=\"{}\"", self.pod);
                let labelled = match series.strip_suffix('}') {
                    Some(open) => format!("{open},{target}}}"),
                    None => format!("{series}{{{target}}}"),
                };
                let values: Vec<String> = self
                    .taken
                    .iter()
                    .map(|s| s.get(series).map_or("_".to_owned(), |v| v.to_string()))
                    .collect();
                json!({"series": labelled, "values": values.join(" ")})
            })
            .collect()
    }
}

/// One promtool test group: a broker's scrapes and, at given minutes, every alert that
/// must be firing then, and PromQL expressions with their expected samples (such as
/// `ALERTS{…}`, which holds pending alerts too).
#[derive(Debug)]
pub struct TestGroup {
    pub name: String,
    pub input_series: Vec<Value>,
    /// `(eval minute, alert name, exp_alerts)`.
    pub cases: Vec<(u32, String, Vec<Value>)>,
    /// `(eval minute, expr, exp_samples)`.
    pub exprs: Vec<(u32, String, Vec<Value>)>,
}

impl TestGroup {
    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "interval": format!("{INTERVAL_MINUTES}m"),
            "input_series": self.input_series,
            "alert_rule_test": self.cases.iter().map(|(minute, alert, exp)| json!({
                "eval_time": format!("{minute}m"),
                "alertname": alert,
                "exp_alerts": exp,
            })).collect::<Vec<_>>(),
            "promql_expr_test": self.exprs.iter().map(|(minute, expr, exp)| json!({
                "eval_time": format!("{minute}m"),
                "expr": expr,
                "exp_samples": exp,
            })).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_the_body_without_comments() {
        let response = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n# HELP x_total X.\n# TYPE x counter\nx_total{provider=\"a b\",code=\"OK\"} 3\ny 0.5\n# EOF\n";
        let got = samples(response);
        assert_eq!(
            got,
            BTreeMap::from([
                ("x_total{provider=\"a b\",code=\"OK\"}".to_owned(), 3.0),
                ("y".to_owned(), 0.5),
            ])
        );
    }

    fn rules(annotation: &str) -> Rules {
        let rule = json!({
            "alert": "A",
            "labels": {"severity": "warning"},
            "annotations": {"summary": annotation},
        });
        Rules {
            dir: tempdir(),
            alerts: BTreeMap::from([("A".to_owned(), rule)]),
        }
    }

    #[test]
    fn firing_fills_in_the_alert_labels() {
        let exp = rules("{{ $labels.pod }} and {{ $labels.provider }}: {{ $labels.pod }}")
            .firing("A", &[("pod", "p"), ("provider", "x")]);
        assert_eq!(
            exp,
            json!({
                "exp_labels": {"pod": "p", "provider": "x", "severity": "warning"},
                "exp_annotations": {"summary": "p and x: p"},
            })
        );
    }

    #[test]
    #[should_panic(expected = "reads $labels.cluster")]
    fn firing_refuses_an_annotation_reading_a_label_the_alert_lacks() {
        rules("{{ $labels.cluster }}").firing("A", &[("pod", "p")]);
    }
}
