//! Where a pod would land now, and why, or why nowhere: the placement engine's answer for a pod
//! that is not created, over the cluster as listed (see `runtimekit_placement::snapshot`).

use crate::cards::{CardRow, position_of};
use crate::explain::hints;
use crate::slices::{mode_and_share, nics_sentence, share_phrase};
use runtimekit_placement::{Decision, Locality};
use serde::Serialize;

/// What `kubectl gpu fit` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fit {
    pub namespace: String,
    pub pod: String,
    /// Whether the pod would be placed now.
    pub fits: bool,
    pub node: Option<String>,
    /// Each card it would get: `container`, card index and what of it.
    pub cards: Vec<FitCard>,
    /// The answer, one sentence a line.
    pub lines: Vec<String>,
}

/// One card a fitted pod would get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FitCard {
    pub container: String,
    pub index: u32,
    pub uuid: String,
    pub share: String,
}

/// The answer for pod `namespace/name`: the engine's decision, or its reasons for none.
/// `cards` are the cluster's card rows (for models and positions); `gang` the pod's gang.
pub fn answer(
    namespace: &str,
    name: &str,
    outcome: Result<&Decision, String>,
    cards: &[CardRow],
    gang: Option<&str>,
) -> Fit {
    let mut lines = Vec::new();
    if let Some(gang) = gang {
        lines.push(format!(
            "It is a member of gang {gang}, which is placed all at once: this is where this member alone would go."
        ));
    }
    let decision = match outcome {
        Ok(decision) => decision,
        Err(message) => {
            lines.insert(
                0,
                format!("Pod {namespace}/{name} would not be placed now."),
            );
            lines.insert(1, format!("The scheduler would say: {message}"));
            let at = 2;
            for (i, hint) in hints(&message).into_iter().enumerate() {
                lines.insert(at + i, hint);
            }
            return Fit {
                namespace: namespace.into(),
                pod: name.into(),
                fits: false,
                node: None,
                cards: Vec::new(),
                lines,
            };
        }
    };
    let node = &decision.node;
    lines.insert(
        0,
        match position_of(cards, node) {
            Some(position) => format!(
                "Pod {namespace}/{name} would land on node {node}, under {position}. Nothing was created."
            ),
            None => format!("Pod {namespace}/{name} would land on node {node}. Nothing was created."),
        },
    );
    // The GpuSlices the decision would write, in the same order as its cards.
    let mut specs = decision.gpu_slices(namespace, name).into_iter();
    let mut fitted = Vec::new();
    for container in &decision.containers {
        for card in &container.cards {
            let model = cards
                .iter()
                .find(|c| &c.node == node && c.index == card.index)
                .map_or_else(String::new, |c| format!(" {}", c.model));
            let share = specs.next().map_or_else(String::new, |spec| {
                let (mode, share) = mode_and_share(&spec);
                share_phrase(mode, &share)
            });
            lines.push(format!(
                "Container {}: card {}{model} ({}) as {share}.",
                container.container, card.index, card.uuid
            ));
            fitted.push(FitCard {
                container: container.container.clone(),
                index: card.index,
                uuid: card.uuid.clone(),
                share,
            });
        }
        if let Some(locality) = &container.locality {
            lines.push(format!(
                "Its cards were chosen {}.",
                locality_words(locality)
            ));
        }
        if !container.nics.is_empty() {
            lines.push(nics_sentence(&container.nics));
        }
    }
    Fit {
        namespace: namespace.into(),
        pod: name.into(),
        fits: true,
        node: Some(node.clone()),
        cards: fitted,
        lines,
    }
}

fn locality_words(locality: &Locality) -> String {
    match locality {
        Locality::InterconnectGroup => "within one interconnect group".into(),
        Locality::AcrossGroups => "across interconnect groups (none holds them all)".into(),
        Locality::PcieSwitch => "under one PCIe switch, with their NICs".into(),
        Locality::NumaNode => "within one NUMA node, with their NICs".into(),
        Locality::Socket => "within one CPU socket, with their NICs".into(),
        Locality::CrossSocket => "across CPU sockets (no socket holds them all)".into(),
        Locality::NvLink { links } => format!("joined by NVLink ({links} link(s) between them)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtimekit_placement::{CardPlacement, ContainerPlacement, Resources, Share};

    #[test]
    fn a_fit_names_node_cards_and_locality_and_a_miss_the_reasons() {
        let decision = Decision {
            pod_uid: "u".into(),
            node: "n1".into(),
            containers: vec![ContainerPlacement {
                container: "train".into(),
                cards: vec![CardPlacement {
                    index: 3,
                    uuid: "GPU-3".into(),
                    replica: 0,
                    share: Share::Tdm {
                        core: Some(50),
                        memory_mib: Some(8192),
                    },
                }],
                nics: vec!["mlx5_1".into()],
                locality: Some(Locality::PcieSwitch),
            }],
            resources: Resources::default(),
            gang: None,
        };
        let fit = answer("ml", "p", Ok(&decision), &[], None);
        assert!(fit.fits);
        assert_eq!(
            fit.lines,
            [
                "Pod ml/p would land on node n1. Nothing was created.",
                "Container train: card 3 (GPU-3) as a time-division share (50% 8Gi).",
                "Its cards were chosen under one PCIe switch, with their NICs.",
                "Its RDMA NICs, the nearest to its cards: mlx5_1.",
            ]
        );
        let message =
            "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.";
        let miss = answer("ml", "p", Err(message.into()), &[], Some("train"));
        assert!(!miss.fits);
        assert_eq!(
            miss.lines,
            [
                "Pod ml/p would not be placed now.".to_owned(),
                format!("The scheduler would say: {message}"),
                "The pod's nodeSelector or affinity rules those nodes out.".to_owned(),
                "It is a member of gang train, which is placed all at once: this is where this member alone would go.".to_owned(),
            ]
        );
    }
}
