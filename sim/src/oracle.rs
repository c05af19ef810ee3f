//! The oracle's extra checks, called once at the end of every swarm seed (after the world's
//! own safety checks and the liveness check). Engineer C's slice fills this in.

use crate::outcome::Failure;
use crate::swarm::SwarmConfig;
use crate::world::World;

/// Every broken invariant the oracle finds in `world` at the end of the seed `cfg`.
pub fn check(_world: &World, _cfg: &SwarmConfig) -> Vec<Failure> {
    Vec::new()
}
