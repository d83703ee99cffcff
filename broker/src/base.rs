//! The ground floor: modules that import nothing of the broker's outside this folder, so every
//! other layer may use them.

pub mod bucket;
pub mod clock;
pub mod conn;
pub mod files;
pub mod gate;
pub mod socket;
pub mod text;
