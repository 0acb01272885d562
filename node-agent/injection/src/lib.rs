//! What a container holding cards is given, described once for both ways the node gives it:
//! `lj-runtime` writes it into the container's OCI spec (pods of the kit's scheduler), and the
//! DRA driver writes it into a CDI spec that the container runtime applies (pods with
//! ResourceClaims). Both paths give the same devices, environment and limits.
//!
//! - [`grant`]: what a container holds (cards with their mode and limits, NICs);
//! - [`hardware`]: the node's device files, as the resource layer lists them;
//! - [`given`]: what a grant gives on that hardware (device files, environment, the isolation
//!   library's mounts);
//! - [`isolation`]: where the isolation library and its folders go in a container;
//! - [`host`]: what both paths do on the host (device numbers, the isolation folder).

pub mod given;
pub mod grant;
pub mod hardware;
pub mod host;
pub mod isolation;
