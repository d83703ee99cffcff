//! Each provider type's section of the config: its fields, defaults and checks, the
//! per-cluster keys it lets through (`OVERRIDE_KEYS`, `LOCATING_KEYS`). Serde only and
//! compiled in every build, whichever provider features are on, so a slim build still parses
//! and explains an entry of any type. The providers' runtime code (`crate::providers`) reads
//! these; nothing here reads it.

pub mod aws;
pub mod azure;
pub mod exec;
pub mod file;
pub mod gcp;
pub mod kubernetes_secret;
