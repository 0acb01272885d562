//! The stable reasons of the resource layer's errors. Each is one PascalCase word, sent in the
//! `runtimekit-reason` metadata entry of a gRPC status (see `error`), so that callers (the
//! node agent, Events, metrics) branch on a typed value rather than on a copied string.

use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// Declares the reasons once, so the enum, [`Reason::ALL`] and the strings on the wire cannot
/// disagree: each reason travels as the name of its variant.
macro_rules! reasons {
    ($($(#[doc = $doc:literal])* $name:ident,)+) => {
        /// Why a call to the resource layer failed.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($(#[doc = $doc])* $name,)+
        }

        impl Reason {
            /// Every reason, in declaration order.
            pub const ALL: &'static [Reason] = &[$(Reason::$name,)+];

            /// The reason as it travels on the wire.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$name => stringify!($name),)+
                }
            }
        }
    };
}

reasons! {
    /// No card has the index.
    NoSuchDevice,
    /// The card at the index has another UUID than the caller expects.
    DeviceUuidMismatch,
    /// The card has fallen off the bus or is otherwise inaccessible.
    DeviceLost,
    /// A MIG instance was asked for on a card whose MIG mode is off.
    MigModeDisabled,
    /// A MIG instance was asked for on a model without MIG.
    MigUnsupported,
    /// A TDM share was asked for on a card in MIG mode.
    MigModeEnabled,
    /// The card's vendor serves whole cards only.
    SharingUnsupported,
    /// The model's MIG table has no such profile.
    UnknownMigProfile,
    /// The profile cannot start at this memory slice.
    IllegalPlacement,
    /// The instance would overlap one that exists.
    InstanceOverlap,
    /// The key names an instance with another spec.
    InstanceKeyConflict,
    /// The instance is in use and cannot be destroyed.
    InstanceInUse,
    /// A request field is invalid.
    InvalidArgument,
    /// A hardware call on the card did not return in time.
    CallHang,
    /// The call did not finish by the caller's deadline (a hardware call under it hangs).
    DeadlineExceeded,
    /// The NVML library could not be loaded.
    NvmlNotFound,
    /// The NVML library is there but the kernel driver is not.
    DriverNotLoaded,
    /// An NVML call failed.
    NvmlError,
    /// The backend does not do this.
    Unsupported,
    /// The hardware profile of the simulated backend is invalid or missing.
    InvalidProfile,
    /// The state file could not be read or written.
    StateFile,
    /// A health subscriber fell too far behind and must subscribe again.
    HealthStreamLagged,
    /// The call failed inside the resource layer (its task panicked).
    Internal,
}

impl Reason {
    /// Whether retrying the same request cannot help: it does not fit the card (a wrong card,
    /// a mode or model that cannot serve it, an unknown profile, an illegal or occupied
    /// placement, a key taken by another spec, an invalid field). Every other reason (a lost
    /// card, a hang, the driver, an instance in use) may pass.
    pub const fn is_permanent(self) -> bool {
        matches!(
            self,
            Self::NoSuchDevice
                | Self::DeviceUuidMismatch
                | Self::MigModeDisabled
                | Self::MigUnsupported
                | Self::MigModeEnabled
                | Self::SharingUnsupported
                | Self::UnknownMigProfile
                | Self::IllegalPlacement
                | Self::InstanceOverlap
                | Self::InstanceKeyConflict
                | Self::InvalidArgument
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A reason string this version does not know: one from a newer or older resource layer, or
/// not from the resource layer at all.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown resource-layer reason {0:?}")]
pub struct UnknownReason(pub String);

impl FromStr for Reason {
    type Err = UnknownReason;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .copied()
            .find(|reason| reason.as_str() == s)
            .ok_or_else(|| UnknownReason(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_reason_round_trips_through_its_string() {
        for &reason in Reason::ALL {
            assert_eq!(reason.as_str().parse::<Reason>(), Ok(reason));
            assert_eq!(reason.to_string(), reason.as_str());
            assert_eq!(reason.as_str(), format!("{reason:?}"), "sent as its name");
        }
        let strings: BTreeSet<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            strings.len(),
            Reason::ALL.len(),
            "no two reasons share a string"
        );
    }

    #[test]
    fn unknown_strings_are_an_error_not_a_guess() {
        for unknown in [
            "",
            "ResourceLayerError",
            "deviceLost",
            "DeviceLost ",
            "Nope",
        ] {
            assert_eq!(
                unknown.parse::<Reason>(),
                Err(UnknownReason(unknown.to_owned()))
            );
        }
    }

    #[test]
    fn permanent_reasons_are_exactly_the_node_agents_former_list() {
        // The strings the node agent matched before the enum existed.
        let former = [
            "NoSuchDevice",
            "DeviceUuidMismatch",
            "MigModeDisabled",
            "MigUnsupported",
            "MigModeEnabled",
            "SharingUnsupported",
            "UnknownMigProfile",
            "IllegalPlacement",
            "InstanceOverlap",
            "InstanceKeyConflict",
            "InvalidArgument",
        ];
        for name in former {
            let reason: Reason = name.parse().expect("a known reason");
            assert!(reason.is_permanent(), "{name}");
        }
        for &reason in Reason::ALL {
            assert_eq!(
                reason.is_permanent(),
                former.contains(&reason.as_str()),
                "{reason}"
            );
        }
    }
}
