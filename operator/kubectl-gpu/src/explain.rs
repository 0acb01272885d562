//! Why a pod is where it is, or why it is not placed, in plain words: from the pod (its
//! scheduler, its `PodScheduled` condition), the slices it holds, its gang's status and the
//! network position of its node.

use crate::cards::{CardRow, position_of};
use crate::layout::layout_words;
use crate::slices::{SliceRow, nics_sentence, share_phrase};
use k8s_openapi::api::core::v1::Pod;
use runtimekit_crds::{GangGroup, GangPhase, NicStatus};
use serde::Serialize;

/// What `kubectl gpu explain` says about one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub namespace: String,
    pub pod: String,
    /// `Placed`, `Pending`, `NotOurs` or `Ended`.
    pub verdict: String,
    pub node: Option<String>,
    /// The explanation, one sentence a line.
    pub lines: Vec<String>,
}

/// What is known about the pod.
#[derive(Debug)]
pub struct Facts<'a> {
    pub pod: &'a Pod,
    /// The scheduler name this project answers to.
    pub scheduler: &'a str,
    /// The pod's slices.
    pub slices: &'a [SliceRow],
    /// The cards of the pod's node.
    pub node_cards: &'a [CardRow],
    /// The RDMA NICs of the pod's node.
    pub node_nics: &'a [NicStatus],
    /// The pod's gang, if it has one.
    pub gang: Option<&'a GangGroup>,
}

/// Explains a pod.
pub fn explain(facts: &Facts) -> Explanation {
    let pod = facts.pod;
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let spec = pod.spec.as_ref();
    let node = spec.and_then(|s| s.node_name.clone());
    let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
    let scheduler = spec
        .and_then(|s| s.scheduler_name.clone())
        .unwrap_or_else(|| "default-scheduler".into());
    let mut lines = Vec::new();
    let verdict = if scheduler != facts.scheduler && !facts.slices.is_empty() {
        // Its cards come through ResourceClaims of the kit's DRA driver.
        lines.push(format!(
            "Pod {namespace}/{name} is placed by {scheduler}, not {}: it holds cards through its ResourceClaims (DRA), which that scheduler allocated and the node agent prepares.",
            facts.scheduler
        ));
        match &node {
            Some(node) => {
                let ended = phase
                    .as_deref()
                    .filter(|p| matches!(*p, "Succeeded" | "Failed"));
                placed(facts, &namespace, &name, node, ended, &mut lines);
            }
            None => lines.push(format!(
                "It is not placed yet: {scheduler} says why in the pod's PodScheduled condition."
            )),
        }
        "Claims"
    } else if scheduler != facts.scheduler {
        lines.push(format!(
            "Pod {namespace}/{name} is placed by {scheduler}, not {}: it gets whole cards only through the kubelet, and no shares.",
            facts.scheduler
        ));
        if node.is_some() {
            lines.push(format!(
                "It runs on node {}.",
                node.as_deref().unwrap_or("-")
            ));
        }
        "NotOurs"
    } else if let Some(node) = &node {
        let ended = phase
            .as_deref()
            .filter(|p| matches!(*p, "Succeeded" | "Failed"));
        placed(facts, &namespace, &name, node, ended, &mut lines);
        if ended.is_some() { "Ended" } else { "Placed" }
    } else {
        pending(facts, &namespace, &name, &mut lines);
        "Pending"
    };
    Explanation {
        namespace,
        pod: name,
        verdict: verdict.into(),
        node,
        lines,
    }
}

/// A placed pod: where, and what it holds; `ended` is the phase of a pod that has ended.
fn placed(
    facts: &Facts,
    namespace: &str,
    name: &str,
    node: &str,
    ended: Option<&str>,
    lines: &mut Vec<String>,
) {
    let (verb, after) = match ended {
        Some(phase) => ("ran", format!(" It has ended ({phase}).")),
        None => ("runs", String::new()),
    };
    lines.push(match position_of(facts.node_cards, node) {
        Some(position) => format!(
            "Pod {namespace}/{name} {verb} on node {node}, under {position} (network pod / leaf switch / HyperNode).{after}"
        ),
        None => format!("Pod {namespace}/{name} {verb} on node {node}.{after}"),
    });
    if facts.slices.is_empty() {
        lines.push(if ended.is_some() {
            "Its cards were given back when it ended.".into()
        } else {
            "It holds no card.".into()
        });
    }
    for slice in facts.slices {
        let card = facts
            .node_cards
            .iter()
            .find(|c| Some(c.index) == slice.card);
        let model = card.map_or_else(String::new, |c| format!(" {}", c.model));
        let what = share_phrase(&slice.mode, &slice.share);
        lines.push(format!(
            "Container {} holds {what} of card {}{model} ({}), {}.",
            slice.container,
            slice.card.map_or("-".into(), |c| c.to_string()),
            slice.card_uuid.as_deref().unwrap_or("-"),
            phase_words(&slice.phase),
        ));
        if !slice.nics.is_empty() {
            lines.push(nics_sentence(&slice.nics));
        }
        if let Some(card) = card
            && !card.healthy
        {
            lines.push(format!(
                "That card is unhealthy now ({}); the pod keeps it, and no new work goes there.",
                card.health_reason.as_deref().unwrap_or("no reason given")
            ));
        }
    }
    if ended.is_none() {
        lines.extend(layout_words(
            facts.slices,
            facts.node_cards,
            facts.node_nics,
        ));
    }
    if let Some(gang) = facts.gang {
        lines.push(gang_words(gang));
    }
}

fn pending(facts: &Facts, namespace: &str, name: &str, lines: &mut Vec<String>) {
    let condition = facts
        .pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        });
    match condition {
        Some(condition) => {
            lines.push(format!(
                "Pod {namespace}/{name} is not placed ({}).",
                condition.reason.as_deref().unwrap_or("Unschedulable")
            ));
            if let Some(message) = &condition.message {
                lines.push(format!("The scheduler says: {message}"));
                lines.extend(hints(message));
            }
        }
        None => lines.push(format!(
            "Pod {namespace}/{name} is not placed yet, and the scheduler has not reported on it: it is waiting for its turn or for its gang's other members."
        )),
    }
    if let Some(gang) = facts.gang {
        lines.push(gang_words(gang));
    }
}

/// What to do about the clauses of a scheduler message a user can act on.
pub fn hints(message: &str) -> Vec<String> {
    let known = [
        (
            "were not labelled lj_runtimekit_enable=true",
            "Those nodes are not GPU nodes of this project: the platform team labels them lj_runtimekit_enable=true.",
        ),
        (
            "had no node agent offering cards",
            "Those nodes' cards are not offered: their agent is not reporting (check the runtimekit-node-agent pods there), or the node installer has not set containerd up (the node's TopologyGroup condition RuntimeReady says why).",
        ),
        (
            "switched off",
            "A function the pod needs is switched off (the message names the switch): ask the platform team, or ask for something else.",
        ),
        (
            "didn't match Pod's node affinity/selector",
            "The pod's nodeSelector or affinity rules those nodes out.",
        ),
        (
            "untolerated taint",
            "Those nodes carry a taint the pod does not tolerate.",
        ),
        (
            "free",
            "The cards that could serve the request are taken: the pod is placed when capacity frees up.",
        ),
    ];
    known
        .iter()
        .filter(|(clause, _)| message.contains(clause))
        .map(|(_, hint)| (*hint).to_owned())
        .collect()
}

fn gang_words(gang: &GangGroup) -> String {
    let name = gang.metadata.name.as_deref().unwrap_or("-");
    let Some(status) = &gang.status else {
        return format!("It is a member of gang {name}, which has no status yet.");
    };
    let members = status.members.clone().unwrap_or_default();
    let mut text = format!(
        "It is a member of gang {name} ({} of {} bound, {} running, attempt {}, phase {}).",
        members.bound,
        gang.spec.min_member,
        members.running,
        status.attempts,
        status
            .phase
            .map_or_else(|| "Waiting".into(), |p| format!("{p:?}"))
    );
    if let Some(placement) = &status.placement {
        text.push_str(&format!(
            " The gang was packed within {:?} {} ({} node(s)).",
            placement.tier,
            placement.group,
            placement.nodes.len()
        ));
    }
    if status.phase == Some(GangPhase::TimedOut)
        && let Some(message) = &status.message
    {
        text.push_str(&format!(" Its last attempt timed out: {message}"));
    }
    text
}

fn phase_words(phase: &str) -> String {
    match phase {
        "Ready" => "ready on the node".into(),
        "Pending" | "Reserved" | "Bound" => "waiting for the node agent".into(),
        "Claimed" => "given through its ResourceClaim".into(),
        "Allocated" => "allocated to its ResourceClaim".into(),
        "Creating" => "being created by the node agent".into(),
        other => format!("phase {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtimekit_crds::{GangGroupSpec, GangGroupStatus, GangMembers, GangPlacement, Tier};
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).expect("pod")
    }

    fn card_row() -> CardRow {
        CardRow {
            node: "n1".into(),
            index: 2,
            uuid: "GPU-2".into(),
            model: "NVIDIA H800".into(),
            mode: "TDM".into(),
            core_free: Some(70),
            memory_free_mib: Some(77_824),
            mig_instances: Vec::new(),
            mig_free: Vec::new(),
            healthy: false,
            health_reason: Some("XID 79".into()),
            pods: vec!["ml/infer".into()],
            position: "np-1/leaf-1".into(),
            numa_node: None,
            pcie_switch: None,
            interconnect_group: None,
        }
    }

    fn slice_row() -> SliceRow {
        crate::slices::tests::row("infer", 2)
    }

    #[test]
    fn a_placed_pod_is_told_by_node_card_share_and_health() {
        let pod = pod(json!({"metadata": {"name": "infer", "namespace": "ml"},
            "spec": {"schedulerName": "lj-runtimekit-scheduler", "nodeName": "n1", "containers": []}}));
        let cards = [card_row()];
        let slices = [slice_row()];
        let said = explain(&Facts {
            pod: &pod,
            scheduler: "lj-runtimekit-scheduler",
            slices: &slices,
            node_cards: &cards,
            node_nics: &[],
            gang: None,
        });
        assert_eq!(said.verdict, "Placed");
        assert_eq!(
            said.lines,
            [
                "Pod ml/infer runs on node n1, under np-1/leaf-1 (network pod / leaf switch / HyperNode).",
                "Container app holds a time-division share (30% 4Gi) of card 2 NVIDIA H800 (GPU-2), ready on the node.",
                "That card is unhealthy now (XID 79); the pod keeps it, and no new work goes there.",
            ]
        );
    }

    #[test]
    fn a_pod_of_the_default_scheduler_is_told_what_its_claims_hold() {
        let pod = pod(json!({"metadata": {"name": "infer", "namespace": "ml"},
            "spec": {"nodeName": "n1", "containers": []}}));
        let cards = [card_row()];
        let mut claimed = slice_row();
        claimed.phase = "Claimed".into();
        claimed.mode = "Whole".into();
        let said = explain(&Facts {
            pod: &pod,
            scheduler: "lj-runtimekit-scheduler",
            slices: &[claimed],
            node_cards: &cards,
            node_nics: &[],
            gang: None,
        });
        assert_eq!(said.verdict, "Claims");
        assert_eq!(
            said.lines[..3],
            [
                "Pod ml/infer is placed by default-scheduler, not lj-runtimekit-scheduler: it holds cards through its ResourceClaims (DRA), which that scheduler allocated and the node agent prepares.",
                "Pod ml/infer runs on node n1, under np-1/leaf-1 (network pod / leaf switch / HyperNode).",
                "Container app holds the whole card of card 2 NVIDIA H800 (GPU-2), given through its ResourceClaim.",
            ]
        );
    }

    #[test]
    fn an_ended_pod_is_told_where_it_ran_and_that_its_cards_went_back() {
        let pod = pod(json!({"metadata": {"name": "job-0", "namespace": "ml"},
            "spec": {"schedulerName": "lj-runtimekit-scheduler", "nodeName": "n1", "containers": []},
            "status": {"phase": "Succeeded"}}));
        let cards = [card_row()];
        let said = explain(&Facts {
            pod: &pod,
            scheduler: "lj-runtimekit-scheduler",
            slices: &[],
            node_cards: &cards,
            node_nics: &[],
            gang: None,
        });
        assert_eq!(said.verdict, "Ended");
        assert_eq!(
            said.lines,
            [
                "Pod ml/job-0 ran on node n1, under np-1/leaf-1 (network pod / leaf switch / HyperNode). It has ended (Succeeded).",
                "Its cards were given back when it ended.",
            ]
        );
    }

    #[test]
    fn a_pending_gang_member_is_told_the_schedulers_reason_and_what_to_do() {
        let pod = pod(json!({"metadata": {"name": "w-0", "namespace": "ml"},
            "spec": {"schedulerName": "lj-runtimekit-scheduler", "containers": []},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 node(s) were not labelled lj_runtimekit_enable=true."}]}}));
        let mut gang = GangGroup::new(
            "train",
            GangGroupSpec {
                min_member: 4,
                timeout_seconds: 180,
                highest_tier: Tier::NetworkPod,
                job_set: None,
                on_timeout: Default::default(),
            },
        );
        gang.status = Some(GangGroupStatus {
            phase: Some(GangPhase::Waiting),
            members: Some(GangMembers {
                seen: 4,
                ..GangMembers::default()
            }),
            placement: None,
            attempts: 2,
            ..GangGroupStatus::default()
        });
        let said = explain(&Facts {
            pod: &pod,
            scheduler: "lj-runtimekit-scheduler",
            slices: &[],
            node_cards: &[],
            node_nics: &[],
            gang: Some(&gang),
        });
        assert_eq!(said.verdict, "Pending");
        assert_eq!(
            said.lines,
            [
                "Pod ml/w-0 is not placed (Unschedulable).",
                "The scheduler says: 0/3 nodes are available: 3 node(s) were not labelled lj_runtimekit_enable=true.",
                "Those nodes are not GPU nodes of this project: the platform team labels them lj_runtimekit_enable=true.",
                "It is a member of gang train (0 of 4 bound, 0 running, attempt 2, phase Waiting).",
            ]
        );
        let placed = GangPlacement {
            tier: Tier::HyperNode,
            group: "hn-1".into(),
            nodes: vec!["n1".into(), "n2".into()],
        };
        gang.status.as_mut().expect("status").placement = Some(placed);
        assert!(
            gang_words(&gang).ends_with("The gang was packed within HyperNode hn-1 (2 node(s)).")
        );
    }

    #[test]
    fn another_schedulers_pod_is_said_to_be_so() {
        let pod = pod(json!({"metadata": {"name": "web", "namespace": "ml"},
            "spec": {"nodeName": "n1", "containers": []}}));
        let said = explain(&Facts {
            pod: &pod,
            scheduler: "lj-runtimekit-scheduler",
            slices: &[],
            node_cards: &[],
            node_nics: &[],
            gang: None,
        });
        assert_eq!(said.verdict, "NotOurs");
        assert!(
            said.lines[0].contains("placed by default-scheduler"),
            "{:?}",
            said.lines
        );
    }
}
