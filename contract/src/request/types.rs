//! What a pod asks for once parsed: whole cards, a time-division share or a MIG instance per
//! container, and the gang the pod belongs to.

use super::Warning;
use std::fmt;

/// Which name a whole-card request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WholeCardName {
    /// `aliyun.com/gpu`: any vendor.
    AnyVendor,
    /// `nvidia.com/gpu`: NVIDIA cards only.
    Nvidia,
}

/// What one container asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CardRequest {
    /// Whole cards.
    Whole {
        /// How many cards.
        cards: u32,
        /// Which resource name asked for them.
        name: WholeCardName,
    },
    /// A time-division share of each of `cards` cards.
    Tdm {
        /// How many cards, each with the same share (pod label `replica`, default 1).
        cards: u32,
        /// Compute share of each card in percent, 1-100; `None` means no compute cap.
        core: Option<u8>,
        /// Memory of each card in MiB; `None` means no memory cap.
        memory_mib: Option<u64>,
    },
    /// A MIG instance on each of `cards` cards.
    Mig {
        /// How many cards, each with the same instance (pod label `replica`, default 1).
        cards: u32,
        /// Compute slices of each instance: 1, 2, 3, 4 or 7.
        slices: u8,
        /// Memory each instance must offer, in MiB; the container sees at most this much.
        memory_mib: Option<u64>,
    },
}

impl CardRequest {
    /// How many cards the request spans.
    pub fn cards(&self) -> u32 {
        match *self {
            CardRequest::Whole { cards, .. }
            | CardRequest::Tdm { cards, .. }
            | CardRequest::Mig { cards, .. } => cards,
        }
    }
}

impl fmt::Display for CardRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cards = |n: u32| {
            if n == 1 {
                "1 card".to_owned()
            } else {
                format!("{n} cards")
            }
        };
        let memory = |m: Option<u64>| m.map_or_else(|| "all memory".to_owned(), format_mib);
        match *self {
            CardRequest::Whole { cards: n, name } => {
                let name = if name == WholeCardName::Nvidia {
                    "NVIDIA "
                } else {
                    ""
                };
                write!(f, "{} whole {name}card{}", n, if n == 1 { "" } else { "s" })
            }
            CardRequest::Tdm {
                cards: n,
                core,
                memory_mib,
            } => {
                let core =
                    core.map_or_else(|| "uncapped core".to_owned(), |c| format!("{c}% core"));
                write!(
                    f,
                    "time-division share of {}: {core}, {} each",
                    cards(n),
                    memory(memory_mib)
                )
            }
            CardRequest::Mig {
                cards: n,
                slices,
                memory_mib,
            } => {
                let memory = memory_mib.map_or_else(
                    || "the profile's memory".to_owned(),
                    |m| format!("at least {}", format_mib(m)),
                );
                write!(
                    f,
                    "MIG instance of {slices} slices with {memory} on {} each",
                    cards(n)
                )
            }
        }
    }
}

/// MiB as GiB when whole, else MiB.
fn format_mib(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{} GiB", mib / 1024)
    } else {
        format!("{mib} MiB")
    }
}

/// The GPU request of one container.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContainerRequest {
    /// The container's name.
    pub container: String,
    /// What it asks for.
    pub cards: CardRequest,
    /// Whether the RDMA NICs nearest the allocated cards are attached (`aliyun.com/rdma: 1`).
    pub rdma: bool,
}

/// The gang a pod belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GangMembership {
    /// The group's name: the JobSet's name, or the explicit gang-name label.
    pub name: String,
    /// The JobSet the pod comes from, if any.
    pub job_set: Option<String>,
    /// How many pods must be placed together.
    pub min_member: u32,
}

/// Everything a pod asks of this project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRequest {
    /// Whether the pod names this project's scheduler.
    pub ours: bool,
    /// The containers that ask for cards, in spec order.
    pub containers: Vec<ContainerRequest>,
    /// The gang the pod belongs to, if any.
    pub gang: Option<GangMembership>,
    /// Whether the pod uses the host's network (needed for RDMA).
    pub host_network: bool,
    /// Things that are allowed but probably not what the user meant.
    pub warnings: Vec<Warning>,
}

impl PodRequest {
    /// Whether any container asks for cards.
    pub fn wants_cards(&self) -> bool {
        !self.containers.is_empty()
    }
}
