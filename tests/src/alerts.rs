//! The deploy's Prometheus alert rules, evaluated against the broker's own `/metrics`: a
//! test scrapes before and after what it does, and asks whether an alert would fire on the
//! increase between the two. There is no Prometheus here, so this evaluates exactly one
//! shape of expression and refuses every other loudly:
//!
//! `sum by (LABELS) (increase(METRIC{NAME="VALUE", …}[WINDOW])) > 0`
//!
//! over a window that covers the whole test (each series' increase is its value after minus
//! its value before, absent counting as 0).

use std::collections::BTreeMap;
use std::path::Path;

/// The shipped rules, relative to the workspace root.
pub const PROMETHEUS_RULE: &str = "deploy/kueue/components/credbroker-metrics/prometheusrule.yaml";

/// The selector of one alert's expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncreaseAlert {
    pub metric: String,
    pub matchers: BTreeMap<String, String>,
}

impl IncreaseAlert {
    /// The rule named `alert` in [`PROMETHEUS_RULE`]; panics, quoting it, when its expression
    /// is not of the one shape this evaluates.
    pub fn from_deploy(alert: &str) -> IncreaseAlert {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(PROMETHEUS_RULE);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let doc: serde_json::Value =
            serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let expr = doc["spec"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .find(|r| r["alert"] == alert)
            .and_then(|r| r["expr"].as_str())
            .unwrap_or_else(|| panic!("no alert {alert} in {}", path.display()));
        Self::parse(expr).unwrap_or_else(|| {
            panic!("{alert}: not `sum by (…) (increase(METRIC{{…}}[W])) > 0`: {expr:?}")
        })
    }

    fn parse(expr: &str) -> Option<IncreaseAlert> {
        let expr = expr.trim();
        let rest = expr.strip_prefix("sum by (")?;
        let (_labels, rest) = rest.split_once(") (increase(")?;
        let (selector, rest) = rest.split_once('[')?;
        let (_window, rest) = rest.split_once("]))")?;
        if rest.trim() != "> 0" {
            return None;
        }
        let (metric, matchers) = match selector.split_once('{') {
            Some((m, body)) => (m, body.strip_suffix('}')?),
            None => (selector, ""),
        };
        let mut parsed = BTreeMap::new();
        for m in matchers.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            let (name, value) = m.split_once('=')?;
            let value = value.strip_prefix('"')?.strip_suffix('"')?;
            if name.ends_with('!') || value.contains('"') {
                return None;
            }
            parsed.insert(name.trim().to_owned(), value.to_owned());
        }
        Some(IncreaseAlert {
            metric: metric.trim().to_owned(),
            matchers: parsed,
        })
    }

    /// Whether the alert's expression is true on the increase from `before` to `after`
    /// (two `/metrics` scrapes, headers and all).
    pub fn fires(&self, before: &str, after: &str) -> bool {
        let (before, after) = (self.samples(before), self.samples(after));
        let increase: f64 = after
            .iter()
            .map(|(series, v)| v - before.get(series).copied().unwrap_or(0.0))
            .sum();
        increase > 0.0
    }

    /// The samples of the series the selector matches, by their label text.
    fn samples(&self, scrape: &str) -> BTreeMap<String, f64> {
        scrape
            .lines()
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let labels = match series.split_once('{') {
                    Some((name, labels)) if name == self.metric => labels.strip_suffix('}')?,
                    None if series == self.metric => "",
                    _ => return None,
                };
                let all: BTreeMap<&str, &str> = labels
                    .split(',')
                    .filter_map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((k, v.trim_matches('"')))
                    })
                    .collect();
                self.matchers
                    .iter()
                    .all(|(k, v)| all.get(k.as_str()) == Some(&v.as_str()))
                    .then(|| Some((labels.to_owned(), value.parse().ok()?)))?
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shape_is_evaluated_and_every_other_refused() {
        let a =
            IncreaseAlert::parse(r#"sum by (pod) (increase(x_total{answer="rejected"}[15m])) > 0"#)
                .unwrap();
        assert_eq!(a.metric, "x_total");
        let before = "x_total{provider=\"p\",answer=\"rejected\"} 1\nx_total{provider=\"p\",answer=\"accepted\"} 1\n";
        let same = "x_total{provider=\"p\",answer=\"rejected\"} 1\nx_total{provider=\"p\",answer=\"accepted\"} 9\n";
        assert!(!a.fires(before, same), "only the matching series count");
        let more = "x_total{provider=\"p\",answer=\"rejected\"} 2\n";
        assert!(a.fires(before, more));
        assert!(a.fires("", more), "a series absent before counts from 0");
        for other in [
            r#"rate(x_total[5m]) > 0"#,
            r#"sum by (pod) (increase(x_total{answer!="rejected"}[15m])) > 0"#,
            r#"sum by (pod) (increase(x_total[15m])) > 1"#,
        ] {
            assert_eq!(IncreaseAlert::parse(other), None, "{other}");
        }
    }
}
