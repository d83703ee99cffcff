//! client-go's `spec.cluster`: the one cluster type of the shim and the broker, and every
//! conversion between it and the GetToken message's `Cluster`.
//!
//! The same fields travel from `KUBERNETES_EXEC_INFO` (the shim parses them) through the
//! GetToken message to the broker (which validates the config, keeps a compact copy for later
//! and hands the cluster to a wrapped plugin as `KUBERNETES_EXEC_INFO` again). One generic
//! struct holds them at every step; [`Cluster::map`] and the `From` impls below are the only
//! places its fields are listed one by one.

use credbroker_proto::v1;

/// client-go's `spec.cluster` (`clientauthentication.Cluster`).
///
/// `C` is how its `config` is held: by default the JSON text client-go sent (`None` when
/// absent or null), in the broker its validated form. `T` and `B` are how its text and bytes
/// are held: `String` and `Vec<u8>` except in a compact copy kept for hours (`Box<str>`,
/// `Box<[u8]>`: no spare capacity, 8 bytes less each).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cluster<C = Option<String>, T = String, B = Vec<u8>> {
    pub server: T,
    pub tls_server_name: T,
    pub insecure_skip_tls_verify: bool,
    /// PEM bytes, base64-decoded (the JSON carries them base64-encoded).
    pub certificate_authority_data: B,
    pub proxy_url: T,
    pub disable_compression: bool,
    /// `spec.cluster.config`, the cluster's `client.authentication.k8s.io/exec` extension.
    /// By default a JSON object as the text client-go sent, byte for byte (whitespace
    /// included).
    pub config: C,
}

/// A cluster config that a wrapped plugin can be shown: the JSON text to put in
/// `KUBERNETES_EXEC_INFO`, `None` for no config.
pub trait ConfigText {
    fn config_text(&self) -> Option<&str>;
}

impl ConfigText for Option<String> {
    fn config_text(&self) -> Option<&str> {
        self.as_deref()
    }
}

/// The cluster config as the GetToken message carries it, not yet checked: the JSON text
/// (`configJson`, empty for none) and the deprecated Struct (`config`). The broker refuses a
/// message with both.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WireConfig {
    pub json: String,
    pub deprecated_struct: Option<prost_types::Struct>,
}

impl<C, T, B> Cluster<C, T, B> {
    /// The same cluster with its text, bytes and config each converted: `text` runs for
    /// `server`, `tls_server_name` and `proxy_url`, in that order, after `config`.
    pub fn map<C2, T2, B2>(
        self,
        text: impl FnMut(T) -> T2,
        bytes: impl FnOnce(B) -> B2,
        config: impl FnOnce(C) -> C2,
    ) -> Cluster<C2, T2, B2> {
        match self.try_map(text, bytes, |c| {
            Ok::<_, std::convert::Infallible>(config(c))
        }) {
            Ok(cluster) => cluster,
            Err(never) => match never {},
        }
    }

    /// [`map`](Self::map) with a conversion of the config that can fail: the one place the
    /// fields are listed for a conversion.
    pub fn try_map<C2, T2, B2, E>(
        self,
        mut text: impl FnMut(T) -> T2,
        bytes: impl FnOnce(B) -> B2,
        config: impl FnOnce(C) -> Result<C2, E>,
    ) -> Result<Cluster<C2, T2, B2>, E> {
        let config = config(self.config)?;
        Ok(Cluster {
            server: text(self.server),
            tls_server_name: text(self.tls_server_name),
            insecure_skip_tls_verify: self.insecure_skip_tls_verify,
            certificate_authority_data: bytes(self.certificate_authority_data),
            proxy_url: text(self.proxy_url),
            disable_compression: self.disable_compression,
            config,
        })
    }

    /// The same cluster, borrowed field by field (to [`map`](Self::map) into another form
    /// without giving this one up).
    pub fn borrowed(&self) -> Cluster<&C, &T, &B> {
        Cluster {
            server: &self.server,
            tls_server_name: &self.tls_server_name,
            insecure_skip_tls_verify: self.insecure_skip_tls_verify,
            certificate_authority_data: &self.certificate_authority_data,
            proxy_url: &self.proxy_url,
            disable_compression: self.disable_compression,
            config: &self.config,
        }
    }
}

impl<C: ConfigText, T: AsRef<str>, B: AsRef<[u8]>> Cluster<C, T, B> {
    /// client-go's `spec.cluster`, as a wrapped exec plugin gets it in `KUBERNETES_EXEC_INFO`
    /// (the config's text as received).
    pub fn to_exec_cluster(&self) -> Cluster {
        self.borrowed().map(
            |t| t.as_ref().to_owned(),
            |b| b.as_ref().to_vec(),
            |c| c.config_text().map(str::to_owned),
        )
    }
}

/// What the shim sends: the config as the text client-go wrote (`configJson`), never the
/// deprecated Struct.
impl From<Cluster> for v1::Cluster {
    fn from(c: Cluster) -> Self {
        v1::Cluster {
            server: c.server,
            tls_server_name: c.tls_server_name,
            insecure_skip_tls_verify: c.insecure_skip_tls_verify,
            certificate_authority_data: c.certificate_authority_data,
            proxy_url: c.proxy_url,
            disable_compression: c.disable_compression,
            config: None,
            config_json: c.config.unwrap_or_default(),
        }
    }
}

/// What the broker receives, its config still to be checked.
impl From<v1::Cluster> for Cluster<WireConfig> {
    fn from(c: v1::Cluster) -> Self {
        Cluster {
            server: c.server,
            tls_server_name: c.tls_server_name,
            insecure_skip_tls_verify: c.insecure_skip_tls_verify,
            certificate_authority_data: c.certificate_authority_data,
            proxy_url: c.proxy_url,
            disable_compression: c.disable_compression,
            config: WireConfig {
                json: c.config_json,
                deprecated_struct: c.config,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Cluster {
        Cluster {
            server: "https://c1:6443".into(),
            tls_server_name: "kube.example".into(),
            insecure_skip_tls_verify: true,
            certificate_authority_data: b"PEM".to_vec(),
            proxy_url: "http://proxy:3128".into(),
            disable_compression: true,
            config: Some(r#"{"clusterName":"c1"}"#.into()),
        }
    }

    #[test]
    fn the_message_carries_every_field_both_ways() {
        let wire = v1::Cluster::from(full());
        assert_eq!(wire.config, None);
        assert_eq!(wire.config_json, r#"{"clusterName":"c1"}"#);
        let back = Cluster::<WireConfig>::from(wire);
        assert_eq!(back.config.deprecated_struct, None);
        let text = back.map(|t| t, |b| b, |w| Some(w.json));
        assert_eq!(text, full());
        let none = v1::Cluster::from(Cluster {
            config: None,
            ..full()
        });
        assert_eq!(none.config_json, "");
    }

    #[test]
    fn a_compact_copy_comes_back_whole() {
        let c = full();
        let compact: Cluster<Box<str>, Box<str>, Box<[u8]>> = c.borrowed().map(
            |t| t.as_str().into(),
            |b| b.as_slice().into(),
            |config| config.clone().unwrap_or_default().into(),
        );
        assert_eq!(&*compact.proxy_url, "http://proxy:3128");
        let back = compact.map(String::from, Vec::from, |text| Some(String::from(text)));
        assert_eq!(back, c);
        assert_eq!(c.to_exec_cluster(), c);
    }

    #[test]
    fn a_config_conversion_can_fail() {
        let ok: Result<Cluster<usize>, ()> = full().try_map(|t| t, |b| b, |c| Ok(c.unwrap().len()));
        assert_eq!(ok.unwrap().config, 20);
        let err: Result<Cluster<usize>, &str> = full().try_map(|t| t, |b| b, |_| Err("no"));
        assert_eq!(err, Err("no"));
    }
}
