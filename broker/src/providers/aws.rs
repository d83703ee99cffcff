//! `type: aws`: not implemented yet; requests get a clear UNIMPLEMENTED error.

use std::sync::Arc;

use crate::config::ProviderConfig;

use super::Provider;

/// Builds the provider for one config entry.
pub fn build(config: &ProviderConfig) -> Arc<dyn Provider> {
    Arc::new(super::unbuilt::Unbuilt::new(&config.name, config.kind))
}
