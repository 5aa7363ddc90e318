//! Compositions of ops into model blocks, written once over the op traits so they run on every
//! backend. Unlike op `run`s, compositions allocate their intermediates (they are conveniences
//! for runners and tests; a graph-captured runner drives the ops directly with its own buffers).

pub mod latent_moe;

pub use latent_moe::{latent_moe_forward, ExpertWeights, LatentMoeBackend, LatentMoeConfig, LatentMoeWeights, SharedMlp};
