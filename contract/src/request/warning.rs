//! What a pod may ask for but probably did not mean: allowed, and reported as a warning.

use std::fmt;

/// Something allowed that is probably a mistake.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Warning {
    /// `gpu-core: 0` means no cap, but GPU programs hang with it on the original product.
    CoreZero { container: String, resource: String },
    /// RDMA asked for without the host network.
    RdmaWithoutHostNetwork { container: String, resource: String },
    /// A gang member while gangs are switched off: it is placed on its own.
    GangsSwitchedOff { gang: String },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::CoreZero {
                container,
                resource,
            } => write!(
                f,
                "container {container:?}: {resource}: 0 means no compute cap, but GPU programs may hang with it; leave {resource} out instead"
            ),
            Warning::RdmaWithoutHostNetwork {
                container,
                resource,
            } => write!(
                f,
                "container {container:?}: {resource}: 1 needs hostNetwork: true for RDMA traffic"
            ),
            Warning::GangsSwitchedOff { gang } => write!(
                f,
                "gang {gang:?}: gangs are switched off in the shared configuration (features.gangs: false), so this pod is placed on its own, not all or nothing with the rest"
            ),
        }
    }
}

impl Warning {
    /// A stable PascalCase reason for Events.
    pub fn reason(&self) -> &'static str {
        match self {
            Warning::CoreZero { .. } => "GpuCoreZero",
            Warning::RdmaWithoutHostNetwork { .. } => "RdmaWithoutHostNetwork",
            Warning::GangsSwitchedOff { .. } => "GangsSwitchedOff",
        }
    }
}
