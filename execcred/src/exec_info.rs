//! `KUBERNETES_EXEC_INFO`: the ExecCredential (spec only) client-go hands a plugin.

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::json_span::member;
use crate::{ApiVersion, Cluster, Error, KIND};

/// What `KUBERNETES_EXEC_INFO` says.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecInfo {
    pub api_version: ApiVersion,
    /// `spec.interactive`. The broker never prompts: wrapped plugins always see false.
    pub interactive: bool,
    /// `spec.cluster`; client-go sends it only with `provideClusterInfo: true`.
    pub cluster: Option<Cluster>,
}

/// Parses `KUBERNETES_EXEC_INFO`. Absent or empty means an old client or a hand-run plugin:
/// v1beta1 without cluster information. The error names the field that is wrong and never
/// quotes a value but `kind` and `apiVersion`.
pub fn parse_exec_info(raw: Option<&str>) -> Result<ExecInfo, Error> {
    let raw = raw.map(str::trim).unwrap_or_default();
    if raw.is_empty() {
        return Ok(ExecInfo {
            api_version: ApiVersion::V1Beta1,
            interactive: false,
            cluster: None,
        });
    }
    let doc: Value = serde_json::from_str(raw).map_err(Error::ExecInfoNotJson)?;
    let doc = doc.as_object().ok_or(Error::ExecInfoNotAnObject)?;

    let kind = opt_str(doc, "kind", "kind")?;
    if kind != KIND {
        return Err(Error::ExecInfoKind(kind));
    }
    let version = opt_str(doc, "apiVersion", "apiVersion")?;
    let Some(api_version) = ApiVersion::parse(&version) else {
        return Err(Error::ExecInfoApiVersion(version));
    };

    let Some(spec) = opt_object(doc, "spec", "spec")? else {
        return Ok(ExecInfo {
            api_version,
            interactive: false,
            cluster: None,
        });
    };
    let interactive = opt_bool(spec, "interactive", "spec.interactive")?;
    let cluster = match opt_object(spec, "cluster", "spec.cluster")? {
        None => None,
        Some(c) => {
            // Where the config's text is, found only once the document is known to be valid.
            let config_text = member(raw, 0..raw.len(), "spec")
                .and_then(|spec| member(raw, spec, "cluster"))
                .and_then(|cluster| member(raw, cluster, "config"))
                .map(|span| &raw[span]);
            Some(parse_cluster(c, config_text)?)
        }
    };
    Ok(ExecInfo {
        api_version,
        interactive,
        cluster,
    })
}

/// client-go's `spec.cluster` (kebab-case keys, base64 CA); `config_text` is the raw text of
/// its `config` member.
fn parse_cluster(c: &Map<String, Value>, config_text: Option<&str>) -> Result<Cluster, Error> {
    let ca_b64 = opt_str(
        c,
        "certificate-authority-data",
        "spec.cluster.certificate-authority-data",
    )?;
    let certificate_authority_data = base64::engine::general_purpose::STANDARD
        .decode(ca_b64.trim())
        .map_err(Error::CertificateAuthorityNotBase64)?;
    let config = match c.get("config") {
        None | Some(Value::Null) => None,
        Some(Value::Object(_)) => Some(config_text.ok_or(Error::ConfigNotLocated)?.to_owned()),
        Some(_) => return Err(Error::NotAnObject("spec.cluster.config")),
    };
    Ok(Cluster {
        server: opt_str(c, "server", "spec.cluster.server")?,
        tls_server_name: opt_str(c, "tls-server-name", "spec.cluster.tls-server-name")?,
        insecure_skip_tls_verify: opt_bool(
            c,
            "insecure-skip-tls-verify",
            "spec.cluster.insecure-skip-tls-verify",
        )?,
        certificate_authority_data,
        proxy_url: opt_str(c, "proxy-url", "spec.cluster.proxy-url")?,
        disable_compression: opt_bool(
            c,
            "disable-compression",
            "spec.cluster.disable-compression",
        )?,
        config,
    })
}

impl ExecInfo {
    /// `KUBERNETES_EXEC_INFO` as client-go writes it: compact, in the Go structs' field order
    /// (`kind`, `apiVersion`, `spec`; the cluster's fields as `clientauthentication.Cluster`
    /// declares them), empty fields left out, and the cluster's `config` spliced in as the text
    /// it arrived as.
    ///
    /// `config` must hold one JSON value (as [`parse_exec_info`] and the broker's request
    /// check make sure); it is not re-validated here.
    pub fn to_json(&self) -> String {
        let mut out = format!(
            "{{\"kind\":\"{KIND}\",\"apiVersion\":\"{}\",\"spec\":{{",
            self.api_version.as_str()
        );
        if let Some(c) = &self.cluster {
            out.push_str("\"cluster\":");
            c.write_json(&mut out);
            out.push(',');
        }
        out.push_str(if self.interactive {
            "\"interactive\":true}}"
        } else {
            "\"interactive\":false}}"
        });
        out
    }
}

impl Cluster {
    fn write_json(&self, out: &mut String) {
        let mut fields: Vec<(&str, String)> = vec![("server", json_string(&self.server))];
        if !self.tls_server_name.is_empty() {
            fields.push(("tls-server-name", json_string(&self.tls_server_name)));
        }
        if self.insecure_skip_tls_verify {
            fields.push(("insecure-skip-tls-verify", "true".to_owned()));
        }
        if !self.certificate_authority_data.is_empty() {
            let b64 =
                base64::engine::general_purpose::STANDARD.encode(&self.certificate_authority_data);
            fields.push(("certificate-authority-data", json_string(&b64)));
        }
        if !self.proxy_url.is_empty() {
            fields.push(("proxy-url", json_string(&self.proxy_url)));
        }
        if self.disable_compression {
            fields.push(("disable-compression", "true".to_owned()));
        }
        if let Some(config) = &self.config {
            fields.push(("config", config.clone()));
        }
        out.push('{');
        for (i, (key, value)) in fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('"');
            out.push_str(key);
            out.push_str("\":");
            out.push_str(value);
        }
        out.push('}');
    }
}

fn json_string(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// A string field; absent or null reads as empty (Go's `omitempty` drops empty strings).
fn opt_str(obj: &Map<String, Value>, key: &str, path: &'static str) -> Result<String, Error> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(Error::NotAString(path)),
    }
}

/// A boolean field; absent or null reads as false (Go's `omitempty` drops false).
fn opt_bool(obj: &Map<String, Value>, key: &str, path: &'static str) -> Result<bool, Error> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(Error::NotABool(path)),
    }
}

/// An object field; absent or null reads as `None`.
fn opt_object<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    path: &'static str,
) -> Result<Option<&'a Map<String, Value>>, Error> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(_) => Err(Error::NotAnObject(path)),
    }
}

#[cfg(test)]
mod tests;
