//! The slices each pod holds, one row per card of a container.

use runtimekit_crds::{GpuSlice, GpuSliceSpec, SliceMode};
use serde::Serialize;

/// One card a pod's container holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceRow {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub node: String,
    pub card: Option<u32>,
    pub card_uuid: Option<String>,
    /// `Whole`, `TDM` or `MIG`.
    pub mode: String,
    /// What the slice is: `30% 4Gi` for a share, the MIG profile and start, or `whole card`.
    pub share: String,
    /// The node agent's phase: Reserved, Bound, Creating, Ready, Releasing, Failed.
    pub phase: String,
    pub gang: Option<String>,
    pub nics: Vec<String>,
    /// The slice object's name, for `kubectl describe gpuslice`.
    pub slice: String,
    /// SM time the container uses on the card now, percent (with `--prometheus`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sm_used_percent: Option<f64>,
    /// Card memory the container uses now, MiB (with `--prometheus`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_used_mib: Option<f64>,
}

/// A row per slice, by namespace, pod, container and replica.
pub fn rows(slices: &[GpuSlice]) -> Vec<SliceRow> {
    let mut sorted: Vec<&GpuSlice> = slices.iter().collect();
    sorted.sort_by(|a, b| {
        let key = |s: &GpuSlice| {
            (
                s.spec.pod.namespace.clone(),
                s.spec.pod.name.clone(),
                s.spec.pod.container.clone(),
                s.spec.replica_index,
            )
        };
        key(a).cmp(&key(b))
    });
    sorted.into_iter().map(slice_row).collect()
}

/// A slice's mode (`Whole`, `TDM`, `MIG`) and what of the card it is (`30% 4Gi`, `3g.40gb@4`,
/// `whole card`).
pub fn mode_and_share(spec: &GpuSliceSpec) -> (&'static str, String) {
    match spec.mode {
        SliceMode::Whole => ("Whole", "whole card".to_owned()),
        SliceMode::Tdm => ("TDM", tdm_share(spec.core, spec.memory.as_deref())),
        SliceMode::Mig => (
            "MIG",
            match (&spec.mig_profile, spec.mig_placement_start) {
                (Some(profile), Some(start)) => format!("{profile}@{start}"),
                (Some(profile), None) => profile.clone(),
                _ => format!("{} slices", spec.slices.unwrap_or(0)),
            },
        ),
    }
}

/// What a container holds of a card, in words, from a row's mode and share.
pub fn share_phrase(mode: &str, share: &str) -> String {
    match mode {
        "TDM" => format!("a time-division share ({share})"),
        "MIG" => format!("the MIG instance {share}"),
        _ => "the whole card".to_owned(),
    }
}

/// The sentence naming a container's RDMA NICs.
pub fn nics_sentence(nics: &[String]) -> String {
    format!(
        "Its RDMA NICs, the nearest to its cards: {}.",
        nics.join(", ")
    )
}

/// The row of one slice.
pub fn slice_row(slice: &GpuSlice) -> SliceRow {
    let spec = &slice.spec;
    let (mode, share) = mode_and_share(spec);
    SliceRow {
        namespace: spec.pod.namespace.clone(),
        pod: spec.pod.name.clone(),
        container: spec.pod.container.clone(),
        node: spec.node_name.clone().unwrap_or_else(|| "-".into()),
        card: spec.card.as_ref().map(|c| c.index),
        card_uuid: spec.card.as_ref().map(|c| c.uuid.clone()),
        mode: mode.into(),
        share,
        phase: slice
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map_or_else(|| "Pending".to_owned(), |p| format!("{p:?}")),
        gang: spec.gang.clone(),
        nics: spec.nics.clone(),
        slice: slice.metadata.name.clone().unwrap_or_default(),
        sm_used_percent: None,
        memory_used_mib: None,
    }
}

/// `30% 4Gi`, `30%`, `4Gi`, or `no cap`.
pub fn tdm_share(core: Option<u32>, memory: Option<&str>) -> String {
    match (core, memory) {
        (Some(core), Some(memory)) => format!("{core}% {memory}"),
        (Some(core), None) => format!("{core}%"),
        (None, Some(memory)) => memory.to_owned(),
        (None, None) => "no cap".into(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use runtimekit_crds::{CardRef, GpuSliceSpec, GpuSliceStatus, PodRef, SlicePhase};

    /// A TDM row of pod `pod` in `ml` on card `card`.
    pub(crate) fn row(pod: &str, card: u32) -> SliceRow {
        SliceRow {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "app".into(),
            node: "n1".into(),
            card: Some(card),
            card_uuid: Some(format!("GPU-{card}")),
            mode: "TDM".into(),
            share: "30% 4Gi".into(),
            phase: "Ready".into(),
            gang: None,
            nics: Vec::new(),
            slice: format!("{pod}-0"),
            sm_used_percent: None,
            memory_used_mib: None,
        }
    }

    #[test]
    fn each_slice_reads_as_what_it_is() {
        let mut tdm = GpuSlice::new(
            "tdm-0",
            GpuSliceSpec {
                node_name: Some("n1".into()),
                card: Some(CardRef {
                    index: 2,
                    uuid: "GPU-2".into(),
                }),
                mode: SliceMode::Tdm,
                core: Some(30),
                memory: Some("4Gi".into()),
                slices: None,
                mig_profile: None,
                mig_placement_start: None,
                pod: PodRef {
                    namespace: "ml".into(),
                    name: "infer".into(),
                    uid: "u".into(),
                    container: "app".into(),
                },
                replica_index: 0,
                gang: None,
                nics: Vec::new(),
            },
        );
        tdm.status = Some(GpuSliceStatus {
            phase: Some(SlicePhase::Ready),
            ..GpuSliceStatus::default()
        });
        let mut mig = tdm.clone();
        mig.metadata.name = Some("mig-0".into());
        mig.spec.mode = SliceMode::Mig;
        mig.spec.pod.name = "a-first".into();
        mig.spec.mig_profile = Some("3g.40gb".into());
        mig.spec.mig_placement_start = Some(4);
        mig.status = None;
        let rows = rows(&[tdm, mig]);
        let shown: Vec<(&str, &str, &str, &str)> = rows
            .iter()
            .map(|r| {
                (
                    r.pod.as_str(),
                    r.mode.as_str(),
                    r.share.as_str(),
                    r.phase.as_str(),
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                ("a-first", "MIG", "3g.40gb@4", "Pending"),
                ("infer", "TDM", "30% 4Gi", "Ready")
            ]
        );
        assert_eq!(tdm_share(None, None), "no cap");
    }
}
