//! rill's glass-box endpoints (docs/glass-box-api.md): every tier of a generation made visible
//! from the engine's real state.

pub(crate) mod choosing;
pub(crate) mod common;
pub(crate) mod layers;
pub(crate) mod live;
pub(crate) mod model;
pub(crate) mod multiverse;
pub(crate) mod receipts;
