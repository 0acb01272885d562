//! What a container holds: its cards, each with its mode and limits, and its RDMA NICs.

/// How a container holds a card.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The whole card.
    Whole,
    /// A time-division share, held to its caps by the isolation library.
    Tdm,
    /// A MIG instance.
    Mig,
}

impl Mode {
    /// The mode as `RUNTIMEKIT_SLICE_MODES` names it (and the allocation annotation).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Whole => "Whole",
            Mode::Tdm => "TDM",
            Mode::Mig => "MIG",
        }
    }

    /// The mode the allocation annotation names, if it is one.
    pub fn from_name(name: &str) -> Option<Mode> {
        match name {
            "Whole" => Some(Mode::Whole),
            "TDM" => Some(Mode::Tdm),
            "MIG" => Some(Mode::Mig),
            _ => None,
        }
    }
}

/// One card a container holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantedCard {
    /// The card's index on the node.
    pub index: u32,
    /// The card's UUID.
    pub uuid: String,
    /// How it is held.
    pub mode: Mode,
    /// Compute share in percent (TDM); `None` means no compute cap.
    pub core: Option<u32>,
    /// Memory cap in MiB; `None` means none.
    pub memory_mib: Option<u64>,
    /// The resource-layer key of its MIG instance (MIG).
    pub instance: Option<String>,
}

/// Everything a container holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// Its cards, in the order the container sees them.
    pub cards: Vec<GrantedCard>,
    /// Its RDMA NICs' names.
    pub nics: Vec<String>,
}

impl Grant {
    /// Whether the grant holds a time-division share, which the isolation library must enforce
    /// (whole cards and MIG instances are bounded by the hardware).
    pub fn needs_enforcing(&self) -> bool {
        self.cards.iter().any(|c| c.mode == Mode::Tdm)
    }

    /// The MIG instance keys the grant needs.
    pub fn instance_keys(&self) -> Vec<String> {
        self.cards
            .iter()
            .filter_map(|c| c.instance.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(mode: Mode) -> GrantedCard {
        GrantedCard {
            index: 0,
            uuid: "GPU-0".into(),
            mode,
            core: None,
            memory_mib: None,
            instance: (mode == Mode::Mig).then(|| "ns/m".into()),
        }
    }

    #[test]
    fn only_time_division_shares_are_enforced() {
        let grant = |modes: &[Mode]| Grant {
            cards: modes.iter().map(|m| card(*m)).collect(),
            nics: vec![],
        };
        assert!(grant(&[Mode::Tdm]).needs_enforcing());
        assert!(grant(&[Mode::Whole, Mode::Tdm]).needs_enforcing());
        assert!(!grant(&[Mode::Whole, Mode::Mig]).needs_enforcing());
        assert!(!grant(&[]).needs_enforcing());
        assert_eq!(grant(&[Mode::Whole, Mode::Mig]).instance_keys(), ["ns/m"]);
        for mode in [Mode::Whole, Mode::Tdm, Mode::Mig] {
            assert_eq!(Mode::from_name(mode.name()), Some(mode));
        }
        assert_eq!(Mode::from_name("Shared"), None);
    }
}
