//! What a caller asks for, converted once from the gRPC message into plain Rust and JSON so
//! providers and the cache never deal with protobuf types.

use base64::Engine as _;
use serde_json::{Map, Number, Value};

use credbroker_proto::v1;

/// A validated `GetToken` request.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRequest {
    pub provider: String,
    pub cluster: Option<ClusterInfo>,
    pub interactive: bool,
}

/// client-go's `spec.cluster`: present only with `provideClusterInfo: true`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterInfo {
    pub server: String,
    pub tls_server_name: String,
    pub insecure_skip_tls_verify: bool,
    pub certificate_authority_data: Vec<u8>,
    pub proxy_url: String,
    pub disable_compression: bool,
    /// The cluster's `client.authentication.k8s.io/exec` extension, with integral numbers
    /// turned back into integers (protobuf's Struct carries every number as a double).
    pub config: Map<String, Value>,
}

/// Why a request was refused before any provider saw it.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RequestError {
    #[error("the request names no provider")]
    MissingProvider,
}

impl TokenRequest {
    /// Converts the wire message, rejecting what no provider could use.
    pub fn from_proto(msg: v1::GetTokenRequest) -> Result<Self, RequestError> {
        if msg.provider.is_empty() {
            return Err(RequestError::MissingProvider);
        }
        let cluster = msg.cluster.map(ClusterInfo::from_proto);
        Ok(Self {
            provider: msg.provider,
            cluster,
            interactive: msg.interactive,
        })
    }

    /// A string key of the cluster config, e.g. `clusterName`; numbers and booleans are
    /// rendered as text, other types count as absent.
    pub fn config_str(&self, key: &str) -> Option<String> {
        match self.cluster.as_ref()?.config.get(key)? {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    /// How the cluster is named in messages and logs: its `clusterName`, else its server.
    pub fn cluster_label(&self) -> String {
        if let Some(name) = self.config_str("clusterName") {
            return name;
        }
        match &self.cluster {
            Some(c) if !c.server.is_empty() => c.server.clone(),
            _ => "(no cluster info)".to_owned(),
        }
    }
}

impl ClusterInfo {
    fn from_proto(c: v1::Cluster) -> Self {
        let config = match c.config {
            Some(s) => struct_to_map(s),
            None => Map::new(),
        };
        Self {
            server: c.server,
            tls_server_name: c.tls_server_name,
            insecure_skip_tls_verify: c.insecure_skip_tls_verify,
            certificate_authority_data: c.certificate_authority_data,
            proxy_url: c.proxy_url,
            disable_compression: c.disable_compression,
            config,
        }
    }

    /// client-go's `spec.cluster` JSON, as a wrapped exec plugin expects it in
    /// `KUBERNETES_EXEC_INFO` (certificate authority data base64-encoded again).
    pub fn to_exec_json(&self) -> Value {
        let mut out = Map::new();
        out.insert("server".into(), Value::String(self.server.clone()));
        if !self.tls_server_name.is_empty() {
            out.insert(
                "tls-server-name".into(),
                Value::String(self.tls_server_name.clone()),
            );
        }
        if self.insecure_skip_tls_verify {
            out.insert("insecure-skip-tls-verify".into(), Value::Bool(true));
        }
        if !self.certificate_authority_data.is_empty() {
            let b64 =
                base64::engine::general_purpose::STANDARD.encode(&self.certificate_authority_data);
            out.insert("certificate-authority-data".into(), Value::String(b64));
        }
        if !self.proxy_url.is_empty() {
            out.insert("proxy-url".into(), Value::String(self.proxy_url.clone()));
        }
        if self.disable_compression {
            out.insert("disable-compression".into(), Value::Bool(true));
        }
        if !self.config.is_empty() {
            out.insert("config".into(), Value::Object(self.config.clone()));
        }
        Value::Object(out)
    }
}

/// A request kept for later (an operator's forced refresh), in compact form: an entry may
/// hold it for hours, and a JSON map costs several hundred bytes where its text costs tens
/// (BENCHMARKS.md, memory per entry).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRequest {
    provider: Box<str>,
    cluster: Option<Box<StoredCluster>>,
    interactive: bool,
}

#[derive(Debug, Clone, PartialEq)]
struct StoredCluster {
    server: Box<str>,
    tls_server_name: Box<str>,
    insecure_skip_tls_verify: bool,
    certificate_authority_data: Box<[u8]>,
    proxy_url: Box<str>,
    disable_compression: bool,
    /// The config map as JSON text.
    config: Box<str>,
}

impl StoredRequest {
    pub fn new(req: &TokenRequest) -> Self {
        let cluster = req.cluster.as_ref().map(|c| {
            Box::new(StoredCluster {
                server: c.server.as_str().into(),
                tls_server_name: c.tls_server_name.as_str().into(),
                insecure_skip_tls_verify: c.insecure_skip_tls_verify,
                certificate_authority_data: c.certificate_authority_data.as_slice().into(),
                proxy_url: c.proxy_url.as_str().into(),
                disable_compression: c.disable_compression,
                config: Value::Object(c.config.clone()).to_string().into(),
            })
        });
        Self {
            provider: req.provider.as_str().into(),
            cluster,
            interactive: req.interactive,
        }
    }

    /// The request again, as it arrived.
    pub fn request(&self) -> TokenRequest {
        let cluster = self.cluster.as_ref().map(|c| ClusterInfo {
            server: c.server.to_string(),
            tls_server_name: c.tls_server_name.to_string(),
            insecure_skip_tls_verify: c.insecure_skip_tls_verify,
            certificate_authority_data: c.certificate_authority_data.to_vec(),
            proxy_url: c.proxy_url.to_string(),
            disable_compression: c.disable_compression,
            // Written by `new` from a map, so it parses back to one.
            config: serde_json::from_str(&c.config).unwrap_or_default(),
        });
        TokenRequest {
            provider: self.provider.to_string(),
            cluster,
            interactive: self.interactive,
        }
    }
}

fn struct_to_map(s: prost_types::Struct) -> Map<String, Value> {
    s.fields
        .into_iter()
        .map(|(k, v)| (k, value_to_json(v)))
        .collect()
}

/// protobuf Value → JSON, turning integral doubles back into integers so `42` stays `42`
/// in cache keys and in what wrapped plugins see (not `42.0`).
fn value_to_json(v: prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(b),
        Some(Kind::StringValue(s)) => Value::String(s),
        Some(Kind::NumberValue(n)) => number_to_json(n),
        Some(Kind::StructValue(s)) => Value::Object(struct_to_map(s)),
        Some(Kind::ListValue(l)) => Value::Array(l.values.into_iter().map(value_to_json).collect()),
    }
}

fn number_to_json(n: f64) -> Value {
    // 2^53: beyond it a double no longer holds every integer exactly.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if n.fract() == 0.0 && n.abs() <= EXACT {
        #[allow(clippy::cast_possible_truncation)] // integral and within ±2^53, so exact
        return Value::Number(Number::from(n as i64));
    }
    Number::from_f64(n).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::value::Kind;

    fn num(n: f64) -> prost_types::Value {
        prost_types::Value {
            kind: Some(Kind::NumberValue(n)),
        }
    }

    #[test]
    fn integral_numbers_are_normalised() {
        assert_eq!(number_to_json(42.0), Value::from(42));
        assert_eq!(number_to_json(-7.0), Value::from(-7));
        assert_eq!(number_to_json(1.5), Value::from(1.5));
        assert_eq!(number_to_json(f64::NAN), Value::Null);
        assert_eq!(number_to_json(1e300), Value::from(1e300));
    }

    #[test]
    fn proto_converts_with_nested_config() {
        let mut fields = std::collections::BTreeMap::new();
        fields.insert(
            "clusterName".to_owned(),
            prost_types::Value {
                kind: Some(Kind::StringValue("a".into())),
            },
        );
        fields.insert("port".to_owned(), num(443.0));
        let msg = v1::GetTokenRequest {
            provider: "p".into(),
            cluster: Some(v1::Cluster {
                server: "https://x".into(),
                certificate_authority_data: b"PEM".to_vec(),
                config: Some(prost_types::Struct { fields }),
                ..Default::default()
            }),
            interactive: false,
        };
        let req = TokenRequest::from_proto(msg).unwrap();
        assert_eq!(req.config_str("clusterName").as_deref(), Some("a"));
        assert_eq!(req.config_str("port").as_deref(), Some("443"));
        assert_eq!(req.cluster_label(), "a");
        let json = req.cluster.unwrap().to_exec_json();
        assert_eq!(json["certificate-authority-data"], "UEVN");
        assert_eq!(json["config"]["port"], 443);
        assert!(json.get("proxy-url").is_none());
    }

    #[test]
    fn stored_requests_come_back_as_they_were() {
        let mut config = Map::new();
        config.insert("clusterName".into(), "a".into());
        config.insert("port".into(), 443.into());
        config.insert("ratio".into(), 0.5.into());
        config.insert(
            "nested".into(),
            serde_json::json!({"list": [1, "two", null]}),
        );
        let req = TokenRequest {
            provider: "p".into(),
            cluster: Some(ClusterInfo {
                server: "https://x".into(),
                tls_server_name: "x".into(),
                insecure_skip_tls_verify: true,
                certificate_authority_data: b"PEM".to_vec(),
                proxy_url: "http://proxy:3128".into(),
                disable_compression: true,
                config,
            }),
            interactive: true,
        };
        assert_eq!(StoredRequest::new(&req).request(), req);
        let bare = TokenRequest {
            provider: "p".into(),
            cluster: None,
            interactive: false,
        };
        assert_eq!(StoredRequest::new(&bare).request(), bare);
    }

    #[test]
    fn empty_provider_is_refused() {
        let err = TokenRequest::from_proto(v1::GetTokenRequest::default()).unwrap_err();
        assert_eq!(err, RequestError::MissingProvider);
    }
}
