//! The ground floor: leaf modules that import nothing of the broker's, so every other layer
//! may use them.

pub mod clock;
pub mod conn;
pub mod files;
pub mod gate;
pub mod socket;
pub mod text;
