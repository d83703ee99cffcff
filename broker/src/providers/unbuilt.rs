//! Placeholder for provider types this build lacks (their Cargo feature is off): the config
//! is still accepted and validated, and every request gets a clear UNIMPLEMENTED error
//! instead of the broker refusing to start.

use crate::config::values::ProviderKind;
use crate::request::TokenRequest;

use super::{BoxFuture, Credential, Provider, ProviderError, Resolved};

#[derive(Debug)]
pub struct Unbuilt {
    name: String,
    kind: ProviderKind,
}

impl Unbuilt {
    pub fn new(name: &str, kind: ProviderKind) -> Self {
        Self {
            name: name.to_owned(),
            kind,
        }
    }

    fn error(&self) -> ProviderError {
        ProviderError::Unimplemented(format!(
            "provider type {} (provider {:?}) is not available in this credbroker build ({}); use a build that has it, or an exec provider wrapping a plugin",
            self.kind,
            self.name,
            env!("CARGO_PKG_VERSION")
        ))
    }
}

impl Provider for Unbuilt {
    fn kind(&self) -> ProviderKind {
        self.kind
    }

    fn available(&self) -> bool {
        false
    }

    fn resolve(&self, _req: &TokenRequest) -> Result<Resolved, ProviderError> {
        Err(self.error())
    }

    fn fetch<'a>(
        &'a self,
        _req: &'a TokenRequest,
        _target: &'a Resolved,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
        Box::pin(async move { Err(self.error()) })
    }
}
