//! What a caller asks for, converted once from the gRPC message into plain Rust and JSON so
//! providers and the cache never deal with protobuf types.
//!
//! The cluster's config (its `client.authentication.k8s.io/exec` extension) has one form
//! from the shim to a wrapped plugin: the JSON text client-go wrote ([`ClusterConfig`]),
//! validated here once, read by providers through its parsed top-level members, handed to a
//! plugin byte for byte and kept as that text in a [`StoredRequest`].

pub mod caller;

use serde_json::{Map, Number, Value};

use credbroker_execcred::{Cluster, ConfigText, WireConfig};
use credbroker_proto::v1;

use crate::base::text::quote;
use crate::config::LimitsConfig;
use crate::request::caller::CallerError;

/// A validated `GetToken` request.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRequest {
    pub provider: String,
    pub cluster: Option<ClusterInfo>,
    pub interactive: bool,
}

/// client-go's `spec.cluster`: present only with `provideClusterInfo: true`. The one cluster
/// type of the shim and the broker (`credbroker_execcred::Cluster`), its config validated.
pub type ClusterInfo = Cluster<ClusterConfig>;

/// The cluster's exec extension: the JSON object as text, as the caller sent it (what a
/// wrapped plugin receives), and its members parsed once (what providers read). Empty when
/// the request has none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterConfig {
    json: Box<str>,
    fields: Map<String, Value>,
}

impl ClusterConfig {
    /// Validates `json` against `limits` (size, JSON, an object, depth, keys, key and string
    /// lengths) and parses it. Empty text is no config.
    pub fn parse(json: String, limits: &LimitsConfig) -> Result<Self, RequestError> {
        if json.is_empty() {
            return Ok(Self::default());
        }
        check_len(
            || CLUSTER_CONFIG.to_owned(),
            json.len(),
            limits.max_cluster_config_bytes,
            "limits.maxClusterConfigBytes",
        )?;
        let fields = match serde_json::from_str::<Value>(&json) {
            Ok(Value::Object(fields)) => fields,
            Ok(_) => {
                return Err(RequestError::BadClusterConfig(
                    "is not a JSON object".to_owned(),
                ));
            }
            // serde_json's message names the line and column, never the text.
            Err(e) => {
                return Err(RequestError::BadClusterConfig(format!(
                    "is not valid JSON: {e}"
                )));
            }
        };
        check_members(fields.iter(), 1, &mut 0, limits)?;
        if let Err(e) = serde_json::from_str::<NoRepeatedKeys>(&json) {
            return Err(RequestError::BadClusterConfig(e.to_string()));
        }
        Ok(Self {
            json: json.into_boxed_str(),
            fields,
        })
    }

    /// The GetToken message's config: the deprecated Struct becomes JSON text here, once;
    /// `configJson` is validated as is. [`check_limits`] has refused a message with both.
    fn from_wire(wire: WireConfig, limits: &LimitsConfig) -> Result<Self, RequestError> {
        match wire.deprecated_struct {
            Some(s) => Ok(Self::from(struct_to_map(s))),
            None => Self::parse(wire.json, limits),
        }
    }

    /// Text this module wrote or validated before (a [`StoredRequest`]'s).
    fn reparse(json: &str) -> Self {
        Self {
            fields: serde_json::from_str(json).unwrap_or_default(),
            json: json.into(),
        }
    }

    /// The JSON text, as received; `None` when the request had no config.
    pub fn as_json(&self) -> Option<&str> {
        (!self.json.is_empty()).then_some(&*self.json)
    }

    /// A top-level member.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.fields.get(key)
    }

    /// The top-level members, sorted by key.
    pub fn fields(&self) -> &Map<String, Value> {
        &self.fields
    }
}

/// A JSON value read only to find an object with a key twice, at any depth. serde_json keeps
/// the last of them and so does Go's encoding/json, but the text is what a wrapped plugin gets
/// and other readers take the first; and the log's cluster label (read by a stricter reader)
/// named the server instead of the `clusterName` served. A repeated key is refused, named.
struct NoRepeatedKeys;

impl<'de> serde::Deserialize<'de> for NoRepeatedKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoRepeatedKeys)
    }
}

impl<'de> serde::de::Visitor<'de> for NoRepeatedKeys {
    type Value = NoRepeatedKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<NoRepeatedKeys>()?.is_some() {}
        Ok(self)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                return Err(serde::de::Error::custom(format!(
                    "has the key \"{}\" more than once",
                    quote(&key)
                )));
            }
            map.next_value::<NoRepeatedKeys>()?;
            seen.insert(key);
        }
        Ok(self)
    }
}

/// What a wrapped plugin is shown: the text as received.
impl ConfigText for ClusterConfig {
    fn config_text(&self) -> Option<&str> {
        self.as_json()
    }
}

/// A config built from members (the deprecated Struct input, tests): written as compact JSON,
/// keys sorted. No members is no config.
impl From<Map<String, Value>> for ClusterConfig {
    fn from(fields: Map<String, Value>) -> Self {
        let json = if fields.is_empty() {
            Box::default()
        } else {
            Value::Object(fields.clone()).to_string().into_boxed_str()
        };
        Self { json, fields }
    }
}

/// How messages name the cluster config.
const CLUSTER_CONFIG: &str = "the cluster config (the client.authentication.k8s.io/exec extension)";

/// Why a request was refused before any provider saw it. Messages name the limit's config key
/// and never quote the oversize text itself.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RequestError {
    #[error("the request names no provider")]
    MissingProvider,
    #[error(
        "{what} is {size} bytes, over the broker's limit of {limit} ({key}); shorten it or raise {key} in the broker config"
    )]
    TooLarge {
        what: String,
        size: usize,
        limit: u32,
        key: &'static str,
    },
    #[error(
        "the cluster config (the client.authentication.k8s.io/exec extension) is nested more than {limit} levels deep (limits.maxClusterConfigDepth); flatten it or raise limits.maxClusterConfigDepth in the broker config"
    )]
    TooDeep { limit: u32 },
    #[error(
        "the cluster config (the client.authentication.k8s.io/exec extension) has more than {limit} keys and list items (limits.maxClusterConfigKeys); trim it or raise limits.maxClusterConfigKeys in the broker config"
    )]
    TooManyKeys { limit: u32 },
    /// `cluster.configJson` is not a JSON object, or both it and `cluster.config` are set.
    #[error("cluster.configJson (the client.authentication.k8s.io/exec extension) {0}")]
    BadClusterConfig(String),
    /// What the gRPC decoder said, quoted.
    #[error("the request could not be decoded: {0}")]
    Undecodable(String),
    /// The shim's `caller` is not of its fixed form.
    #[error(transparent)]
    Caller(#[from] CallerError),
}

impl RequestError {
    /// The request's wire size was over `limits.maxRequestBytes` (tonic's decoder refused it
    /// before reading it).
    pub fn request_too_large(size: usize, limits: &LimitsConfig) -> Self {
        Self::TooLarge {
            what: "the request".to_owned(),
            size,
            limit: limits.max_request_bytes,
            key: "limits.maxRequestBytes",
        }
    }
}

fn check_len(
    what: impl FnOnce() -> String,
    size: usize,
    limit: u32,
    key: &'static str,
) -> Result<(), RequestError> {
    if size > limit as usize {
        return Err(RequestError::TooLarge {
            what: what(),
            size,
            limit,
            key,
        });
    }
    Ok(())
}

/// Checks every bound of `limits` on the message as received, before any of it is converted,
/// stored, logged or counted.
pub fn check_limits(msg: &v1::GetTokenRequest, limits: &LimitsConfig) -> Result<(), RequestError> {
    check_len(
        || "the provider name".to_owned(),
        msg.provider.len(),
        limits.max_provider_name_bytes,
        "limits.maxProviderNameBytes",
    )?;
    let Some(cluster) = &msg.cluster else {
        return Ok(());
    };
    for (field, value) in [
        ("cluster.server", &cluster.server),
        ("cluster.tlsServerName", &cluster.tls_server_name),
        ("cluster.proxyUrl", &cluster.proxy_url),
    ] {
        check_len(
            || field.to_owned(),
            value.len(),
            limits.max_field_bytes,
            "limits.maxFieldBytes",
        )?;
    }
    check_len(
        || "cluster.certificateAuthorityData".to_owned(),
        cluster.certificate_authority_data.len(),
        limits.max_certificate_authority_bytes,
        "limits.maxCertificateAuthorityBytes",
    )?;
    if cluster.config.is_some() && !cluster.config_json.is_empty() {
        return Err(RequestError::BadClusterConfig(
            "and cluster.config are both set; send the config once, as configJson".to_owned(),
        ));
    }
    // `configJson` is checked whole by `ClusterConfig::parse`, the deprecated Struct here.
    if let Some(config) = &cluster.config {
        check_len(
            || CLUSTER_CONFIG.to_owned(),
            prost::Message::encoded_len(config),
            limits.max_cluster_config_bytes,
            "limits.maxClusterConfigBytes",
        )?;
        check_members(config.fields.iter(), 1, &mut 0, limits)?;
    }
    Ok(())
}

/// A value of the cluster config, in either form it arrives in: the deprecated Struct's
/// `prost_types::Value` or the JSON text's parsed `serde_json::Value`. [`check_members`] walks
/// both with the same rules.
trait ConfigValue {
    /// An object's members.
    type Members<'a>: Iterator<Item = (&'a String, &'a Self)>
    where
        Self: 'a;
    /// A list's items.
    type Items<'a>: Iterator<Item = &'a Self>
    where
        Self: 'a;

    fn node(&self) -> Node<'_, Self::Members<'_>, Self::Items<'_>>;
}

/// What [`check_members`] looks at in a value.
enum Node<'a, M, I> {
    String(&'a str),
    Object(M),
    List(I),
    /// A number, a boolean or null: nothing to bound.
    Scalar,
}

impl ConfigValue for prost_types::Value {
    type Members<'a> = std::collections::btree_map::Iter<'a, String, prost_types::Value>;
    type Items<'a> = std::slice::Iter<'a, prost_types::Value>;

    fn node(&self) -> Node<'_, Self::Members<'_>, Self::Items<'_>> {
        use prost_types::value::Kind;
        match &self.kind {
            Some(Kind::StringValue(s)) => Node::String(s),
            Some(Kind::StructValue(s)) => Node::Object(s.fields.iter()),
            Some(Kind::ListValue(l)) => Node::List(l.values.iter()),
            _ => Node::Scalar,
        }
    }
}

impl ConfigValue for Value {
    type Members<'a> = serde_json::map::Iter<'a>;
    type Items<'a> = std::slice::Iter<'a, Value>;

    fn node(&self) -> Node<'_, Self::Members<'_>, Self::Items<'_>> {
        match self {
            Value::String(s) => Node::String(s),
            Value::Object(m) => Node::Object(m.iter()),
            Value::Array(items) => Node::List(items.iter()),
            _ => Node::Scalar,
        }
    }
}

/// Every `limits.*` bound inside the cluster config, on an object's members at `depth`: the
/// depth (an object or a list one level below its parent), the key count (members and list
/// items, `keys` so far) and the lengths (keys and strings). The same rules whichever form the
/// config came in.
fn check_members<'a, V: ConfigValue + 'a>(
    members: impl Iterator<Item = (&'a String, &'a V)>,
    depth: u32,
    keys: &mut u32,
    limits: &LimitsConfig,
) -> Result<(), RequestError> {
    if depth > limits.max_cluster_config_depth {
        return Err(RequestError::TooDeep {
            limit: limits.max_cluster_config_depth,
        });
    }
    for (key, value) in members {
        check_len(
            || format!("a key of the cluster config (\"{}\")", quote(key)),
            key.len(),
            limits.max_field_bytes,
            "limits.maxFieldBytes",
        )?;
        check_value(value, key, depth, keys, limits)?;
    }
    Ok(())
}

fn check_value<V: ConfigValue>(
    v: &V,
    key: &str,
    depth: u32,
    keys: &mut u32,
    limits: &LimitsConfig,
) -> Result<(), RequestError> {
    *keys += 1;
    if *keys > limits.max_cluster_config_keys {
        return Err(RequestError::TooManyKeys {
            limit: limits.max_cluster_config_keys,
        });
    }
    match v.node() {
        Node::String(s) => check_len(
            || format!("the cluster config's \"{}\"", quote(key)),
            s.len(),
            limits.max_field_bytes,
            "limits.maxFieldBytes",
        ),
        Node::Object(members) => check_members(members, depth + 1, keys, limits),
        Node::List(mut items) => {
            if depth + 1 > limits.max_cluster_config_depth {
                return Err(RequestError::TooDeep {
                    limit: limits.max_cluster_config_depth,
                });
            }
            items.try_for_each(|item| check_value(item, key, depth + 1, keys, limits))
        }
        Node::Scalar => Ok(()),
    }
}

/// How a request's cluster is named in a log line, read straight from the wire message so that
/// a refused request is logged like an accepted one: its `clusterName`, else its server, quoted
/// (cut short, control characters escaped).
pub fn cluster_label_of(msg: &v1::GetTokenRequest) -> String {
    use prost_types::value::Kind;
    let Some(cluster) = &msg.cluster else {
        return NO_CLUSTER_INFO.to_owned();
    };
    let name = if cluster.config_json.is_empty() {
        cluster
            .config
            .as_ref()
            .and_then(|c| c.fields.get("clusterName"))
            .and_then(|v| match &v.kind {
                Some(Kind::StringValue(s)) if !s.is_empty() => Some(quote(s)),
                Some(Kind::NumberValue(n)) => Some(number_to_json(*n).to_string()),
                Some(Kind::BoolValue(b)) => Some(b.to_string()),
                _ => None,
            })
    } else {
        cluster_name_in_json(&cluster.config_json)
    };
    match name {
        Some(name) => name,
        None if !cluster.server.is_empty() => quote(&cluster.server),
        None => NO_CLUSTER_INFO.to_owned(),
    }
}

/// `clusterName` of a config's JSON text, quoted as [`cluster_label_of`] does; `None` when the
/// text is not an object with one (it is refused later, with the reason). Only that member is
/// kept: the others are skipped without being stored.
fn cluster_name_in_json(json: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct OnlyName {
        #[serde(rename = "clusterName")]
        cluster_name: Option<Value>,
    }
    match serde_json::from_str::<OnlyName>(json).ok()?.cluster_name? {
        Value::String(s) if !s.is_empty() => Some(quote(&s)),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The cluster label of a request without cluster info.
const NO_CLUSTER_INFO: &str = "(no cluster info)";

impl TokenRequest {
    /// Converts the wire message, rejecting what no provider could use and anything over
    /// `limits`.
    pub fn from_proto(
        msg: v1::GetTokenRequest,
        limits: &LimitsConfig,
    ) -> Result<Self, RequestError> {
        check_limits(&msg, limits)?;
        if msg.provider.is_empty() {
            return Err(RequestError::MissingProvider);
        }
        let cluster = msg
            .cluster
            .map(|c| {
                Cluster::<WireConfig>::from(c).try_map(
                    |t| t,
                    |b| b,
                    |w| ClusterConfig::from_wire(w, limits),
                )
            })
            .transpose()?;
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
            _ => NO_CLUSTER_INFO.to_owned(),
        }
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

/// The cluster, compact: text and bytes without spare capacity, the config as its JSON text,
/// as received.
type StoredCluster = Cluster<Box<str>, Box<str>, Box<[u8]>>;

impl StoredRequest {
    /// `req` as text, with its CA data only when `with_ca` (a provider that passes it on):
    /// otherwise the request again has none.
    pub fn new(req: &TokenRequest, with_ca: bool) -> Self {
        let cluster = req.cluster.as_ref().map(|c| {
            Box::new(c.borrowed().map(
                |text| text.as_str().into(),
                |ca| {
                    if with_ca {
                        ca.as_slice().into()
                    } else {
                        Box::default()
                    }
                },
                |config| config.json.clone(),
            ))
        });
        Self {
            provider: req.provider.as_str().into(),
            cluster,
            interactive: req.interactive,
        }
    }

    /// The bytes it holds on the heap (what `cache.maxBytes` counts).
    pub fn heap_bytes(&self) -> usize {
        self.provider.len()
            + self.cluster.as_ref().map_or(0, |c| {
                std::mem::size_of::<StoredCluster>()
                    + c.server.len()
                    + c.tls_server_name.len()
                    + c.certificate_authority_data.len()
                    + c.proxy_url.len()
                    + c.config.len()
            })
    }

    /// The request again, as it arrived (less the CA data if it was not kept).
    pub fn request(&self) -> TokenRequest {
        let cluster = self.cluster.as_ref().map(|c| {
            c.borrowed().map(
                |text| text.to_string(),
                |ca| ca.to_vec(),
                |config| ClusterConfig::reparse(config),
            )
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
            caller: None,
        };
        let req = TokenRequest::from_proto(msg, &LimitsConfig::default()).unwrap();
        assert_eq!(req.config_str("clusterName").as_deref(), Some("a"));
        assert_eq!(req.config_str("port").as_deref(), Some("443"));
        assert_eq!(req.cluster_label(), "a");
        let info = credbroker_execcred::ExecInfo {
            api_version: credbroker_execcred::ApiVersion::V1,
            interactive: false,
            cluster: Some(req.cluster.unwrap().to_exec_cluster()),
        };
        let doc: Value = serde_json::from_str(&info.to_json()).unwrap();
        let json = &doc["spec"]["cluster"];
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
                config: config.into(),
            }),
            interactive: true,
        };
        assert_eq!(StoredRequest::new(&req, true).request(), req);
        let bare = TokenRequest {
            provider: "p".into(),
            cluster: None,
            interactive: false,
        };
        assert_eq!(StoredRequest::new(&bare, true).request(), bare);
        // Without the CA data (a provider that does not pass it on), the rest is the same.
        let kept = StoredRequest::new(&req, false);
        let again = kept.request();
        let (before, after) = (req.cluster.clone().unwrap(), again.cluster.unwrap());
        assert!(after.certificate_authority_data.is_empty());
        assert_eq!(
            ClusterInfo {
                certificate_authority_data: before.certificate_authority_data.clone(),
                ..after
            },
            before
        );
        assert_eq!(
            StoredRequest::new(&req, true).heap_bytes() - kept.heap_bytes(),
            before.certificate_authority_data.len()
        );
    }

    /// The stored copy is the one cluster type with compact fields: no bigger than the five
    /// boxed slices and two flags the hand-written copy had, so `cache.maxBytes` counts the
    /// same per entry.
    #[test]
    fn the_stored_cluster_stays_compact() {
        assert!(
            std::mem::size_of::<StoredCluster>()
                <= 5 * std::mem::size_of::<Box<str>>() + std::mem::size_of::<usize>(),
            "{} bytes",
            std::mem::size_of::<StoredCluster>()
        );
    }

    #[test]
    fn empty_provider_is_refused() {
        let err =
            TokenRequest::from_proto(v1::GetTokenRequest::default(), &LimitsConfig::default())
                .unwrap_err();
        assert_eq!(err, RequestError::MissingProvider);
    }

    fn string(s: &str) -> prost_types::Value {
        prost_types::Value {
            kind: Some(Kind::StringValue(s.into())),
        }
    }

    fn with_config(fields: Vec<(String, prost_types::Value)>) -> v1::GetTokenRequest {
        v1::GetTokenRequest {
            provider: "p".into(),
            cluster: Some(v1::Cluster {
                server: "https://x".into(),
                config: Some(prost_types::Struct {
                    fields: fields.into_iter().collect(),
                }),
                ..Default::default()
            }),
            interactive: false,
            caller: None,
        }
    }

    fn nested(levels: usize) -> prost_types::Value {
        let mut v = string("leaf");
        for _ in 0..levels {
            v = prost_types::Value {
                kind: Some(Kind::StructValue(prost_types::Struct {
                    fields: [("n".to_owned(), v)].into(),
                })),
            };
        }
        v
    }

    fn refused(msg: v1::GetTokenRequest, limits: &LimitsConfig) -> String {
        TokenRequest::from_proto(msg, limits)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn every_limit_is_checked_and_named() {
        let limits = LimitsConfig::default();
        let long = |n: usize| "x".repeat(n);
        let mut msg = with_config(vec![("clusterName".into(), string("a"))]);
        msg.provider = long(254);
        let e = refused(msg, &limits);
        assert!(
            e.starts_with("the provider name is 254 bytes, over the broker's limit of 253 (limits.maxProviderNameBytes)"),
            "{e}"
        );
        for field in ["server", "tls", "proxy"] {
            let mut msg = with_config(vec![]);
            let c = msg.cluster.as_mut().unwrap();
            *match field {
                "server" => &mut c.server,
                "tls" => &mut c.tls_server_name,
                _ => &mut c.proxy_url,
            } = long(4097);
            let e = refused(msg, &limits);
            assert!(
                e.contains("is 4097 bytes") && e.contains("limits.maxFieldBytes"),
                "{e}"
            );
        }
        let mut msg = with_config(vec![]);
        msg.cluster.as_mut().unwrap().certificate_authority_data = vec![b'-'; 48 * 1024 + 1];
        assert!(refused(msg, &limits).contains("limits.maxCertificateAuthorityBytes"));
        // A string value and a key of the config: the key is named (quoted), the value is not.
        let e = refused(
            with_config(vec![("clusterName".into(), string(&long(5000)))]),
            &limits,
        );
        assert!(
            e.contains("the cluster config's \"clusterName\" is 5000 bytes"),
            "{e}"
        );
        assert!(!e.contains("xxxxx"), "{e}");
        let e = refused(
            with_config(vec![(format!("k\n{}", long(5000)), string("v"))]),
            &limits,
        );
        assert!(
            e.contains("limits.maxFieldBytes") && !e.contains('\n'),
            "{e}"
        );
        // The whole config, its depth and its key count.
        let fields = (0..8)
            .map(|i| (format!("k{i}"), string(&long(3000))))
            .collect();
        assert!(refused(with_config(fields), &limits).contains("limits.maxClusterConfigBytes"));
        let e = refused(with_config(vec![("n".into(), nested(8))]), &limits);
        assert!(
            e.contains("more than 8 levels deep (limits.maxClusterConfigDepth)"),
            "{e}"
        );
        let list = prost_types::Value {
            kind: Some(Kind::ListValue(prost_types::ListValue {
                values: vec![string("a"); 300],
            })),
        };
        let e = refused(with_config(vec![("l".into(), list)]), &limits);
        assert!(
            e.contains("more than 256 keys and list items (limits.maxClusterConfigKeys)"),
            "{e}"
        );
        // Just within every limit: accepted.
        let fields = vec![
            ("clusterName".into(), string(&long(4096))),
            ("n".into(), nested(7)),
        ];
        let mut msg = with_config(fields);
        msg.provider = long(253);
        msg.cluster.as_mut().unwrap().certificate_authority_data = vec![b'-'; 48 * 1024];
        TokenRequest::from_proto(msg, &limits).unwrap();
    }

    #[test]
    fn limits_follow_the_config() {
        let limits = LimitsConfig {
            max_field_bytes: 11, // "https://x" and "clusterName" fit
            max_cluster_config_depth: 2,
            ..LimitsConfig::default()
        };
        let e = refused(
            with_config(vec![("clusterName".into(), string("123456789012"))]),
            &limits,
        );
        assert!(
            e.contains("is 12 bytes, over the broker's limit of 11 (limits.maxFieldBytes)"),
            "{e}"
        );
        assert!(refused(with_config(vec![("n".into(), nested(2))]), &limits).contains("2 levels"));
        TokenRequest::from_proto(with_config(vec![("n".into(), nested(1))]), &limits).unwrap();
    }

    fn with_json(json: &str) -> v1::GetTokenRequest {
        v1::GetTokenRequest {
            provider: "p".into(),
            cluster: Some(v1::Cluster {
                server: "https://x".into(),
                config_json: json.into(),
                ..Default::default()
            }),
            interactive: false,
            caller: None,
        }
    }

    #[test]
    fn config_json_is_kept_as_sent_and_read_once() {
        let text = r#"{ "zone":"b", "clusterName":"a", "id":9007199254740993, "big":123456789012345678901234567890 }"#;
        let req = TokenRequest::from_proto(with_json(text), &LimitsConfig::default()).unwrap();
        assert_eq!(req.config_str("clusterName").as_deref(), Some("a"));
        assert_eq!(req.config_str("id").as_deref(), Some("9007199254740993"));
        let cluster = req.cluster.as_ref().unwrap();
        assert_eq!(cluster.config.as_json(), Some(text));
        assert_eq!(cluster.to_exec_cluster().config.as_deref(), Some(text));
        // Kept for a refresh as the same text.
        let again = StoredRequest::new(&req, true).request();
        assert_eq!(again, req);
        assert_eq!(again.cluster.unwrap().config.as_json(), Some(text));
        assert_eq!(cluster_label_of(&with_json(text)), "a");
        assert_eq!(cluster_label_of(&with_json(r#"{"clusterName":7}"#)), "7");
        assert_eq!(cluster_label_of(&with_json("{not json")), "https://x");
        // No config at all.
        let req = TokenRequest::from_proto(with_json(""), &LimitsConfig::default()).unwrap();
        assert_eq!(req.cluster.unwrap().config, ClusterConfig::default());
    }

    #[test]
    fn the_deprecated_struct_becomes_the_same_text_once() {
        let msg = with_config(vec![
            ("port".into(), num(443.0)),
            ("clusterName".into(), string("a")),
        ]);
        let req = TokenRequest::from_proto(msg, &LimitsConfig::default()).unwrap();
        assert_eq!(
            req.cluster.unwrap().config.as_json(),
            Some(r#"{"clusterName":"a","port":443}"#)
        );
        let mut both = with_json(r#"{"clusterName":"a"}"#);
        both.cluster.as_mut().unwrap().config = Some(prost_types::Struct::default());
        let e = refused(both, &LimitsConfig::default());
        assert!(e.contains("cluster.config are both set"), "{e}");
    }

    #[test]
    fn config_json_meets_every_limit_the_struct_does() {
        let limits = LimitsConfig::default();
        let cases = [
            (
                "{not json".to_owned(),
                "cluster.configJson (the client.authentication.k8s.io/exec extension) is not valid JSON",
            ),
            ("[1]".to_owned(), "is not a JSON object"),
            (
                format!(r#"{{"clusterName":"{}"}}"#, "x".repeat(5000)),
                "the cluster config's \"clusterName\" is 5000 bytes",
            ),
            (
                format!(r#"{{"k\n{}":1}}"#, "x".repeat(5000)),
                "limits.maxFieldBytes",
            ),
            (
                format!(r#"{{"a":"{}"}}"#, "x".repeat(20_000)),
                "limits.maxClusterConfigBytes",
            ),
            (
                format!("{}1{}", r#"{"n":"#.repeat(9), "}".repeat(9)),
                "more than 8 levels deep (limits.maxClusterConfigDepth)",
            ),
            (
                format!(r#"{{"l":[{}1]}}"#, "1,".repeat(299)),
                "more than 256 keys and list items (limits.maxClusterConfigKeys)",
            ),
        ];
        for (text, want) in cases {
            let e = refused(with_json(&text), &limits);
            assert!(e.contains(want), "{want}: {e:.300}");
            // Keys are quoted cut short (256 characters), values never.
            assert!(
                !e.contains(&"x".repeat(300)) && !e.contains('\n'),
                "{e:.300}"
            );
        }
        // Just within: 8 levels, a 4096-byte string.
        let deep = format!(r#"{}{{"s":"leaf"}}{}"#, r#"{"n":"#.repeat(7), "}".repeat(7));
        TokenRequest::from_proto(with_json(&deep), &limits).unwrap();
        let long = format!(r#"{{"clusterName":"{}"}}"#, "x".repeat(4096));
        TokenRequest::from_proto(with_json(&long), &limits).unwrap();
    }

    /// `{"clusterName":"a","clusterName":"b"}` was served as cluster "b" (the last, as
    /// serde_json and Go keep) while the log's label, read by a reader that refuses repeats,
    /// named the server: a key given twice, at any depth, is now refused, named.
    #[test]
    fn a_key_given_twice_is_refused_naming_it() {
        let limits = LimitsConfig::default();
        for (json, key) in [
            (r#"{"clusterName":"a","clusterName":"b"}"#, "clusterName"),
            (r#"{"clusterName":"a","x":{"k":1,"k":2}}"#, "k"),
            (r#"{"l":[{"a\nb":1,"a\nb":1}]}"#, "a\\nb"),
        ] {
            let e = ClusterConfig::parse(json.to_owned(), &limits)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!(
                    "cluster.configJson (the client.authentication.k8s.io/exec extension) has \
                     the key \"{key}\" more than once at line 1 column"
                )),
                "{json}: {e}"
            );
            let status = tonic::Status::from(crate::engine::broker::BrokerError::from(
                ClusterConfig::parse(json.to_owned(), &limits).unwrap_err(),
            ));
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{json}");
        }
        let fine = ClusterConfig::parse(
            r#"{"clusterName":"a","x":{"clusterName":"a"},"l":[{"k":1},{"k":1}]}"#.to_owned(),
            &limits,
        )
        .unwrap();
        assert_eq!(fine.get("clusterName"), Some(&Value::String("a".into())));
    }

    #[test]
    fn cluster_labels_are_quoted_from_the_wire() {
        let msg = with_config(vec![("clusterName".into(), string("a\nb\u{1b}"))]);
        assert_eq!(cluster_label_of(&msg), "a\\nb\\u{1b}");
        let msg = with_config(vec![("clusterName".into(), num(42.0))]);
        assert_eq!(cluster_label_of(&msg), "42");
        assert_eq!(cluster_label_of(&with_config(vec![])), "https://x");
        assert_eq!(
            cluster_label_of(&v1::GetTokenRequest::default()),
            "(no cluster info)"
        );
        let long = with_config(vec![("clusterName".into(), string(&"y".repeat(10_000)))]);
        assert!(cluster_label_of(&long).ends_with("…(10000 bytes)"));
    }
}
