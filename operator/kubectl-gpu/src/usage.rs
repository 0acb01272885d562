//! What each slice's container uses now, from a Prometheus that scrapes the node agents'
//! exporters: `DCGM_FI_CONTAINER_SM_UTIL` and `DCGM_FI_CONTAINER_FB_USED`, matched to a slice by
//! namespace, pod, container and card index (the `gpu` label).

use crate::slices::SliceRow;
use serde_json::Value;
use std::collections::BTreeMap;

/// The families read.
pub const SM_UTIL: &str = "DCGM_FI_CONTAINER_SM_UTIL";
pub const FB_USED: &str = "DCGM_FI_CONTAINER_FB_USED";

/// A container's card: namespace, pod, container and card index.
type Key = (String, String, String, u32);

/// The samples of an instant query's answer (Prometheus' `/api/v1/query` JSON), by key; series
/// without the labels are skipped. An answer that is not a success is an error.
pub fn samples(answer: &str) -> Result<BTreeMap<Key, f64>, String> {
    let body: Value = serde_json::from_str(answer).map_err(|e| format!("not JSON: {e}"))?;
    if body["status"] != "success" {
        return Err(format!("Prometheus answered {body}"));
    }
    Ok(body["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|series| {
            let label = |name: &str| series["metric"][name].as_str().map(str::to_owned);
            let key = (
                label("namespace")?,
                label("pod")?,
                label("container_name")?,
                label("gpu")?.parse().ok()?,
            );
            let value = series["value"][1].as_str()?.parse().ok()?;
            Some((key, value))
        })
        .collect())
}

/// Puts each row's usage beside it, from the samples of [`SM_UTIL`] and [`FB_USED`].
pub fn attach(rows: &mut [SliceRow], sm: &BTreeMap<Key, f64>, memory: &BTreeMap<Key, f64>) {
    for row in rows {
        let Some(card) = row.card else {
            continue;
        };
        let key = (
            row.namespace.clone(),
            row.pod.clone(),
            row.container.clone(),
            card,
        );
        row.sm_used_percent = sm.get(&key).copied();
        row.memory_used_mib = memory.get(&key).copied();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_matched_to_their_slice() {
        let answer = r#"{"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"__name__": "DCGM_FI_CONTAINER_FB_USED", "namespace": "ml", "pod": "infer",
                        "container_name": "app", "gpu": "2"}, "value": [1.0, "1536"]},
            {"metric": {"namespace": "ml", "pod": "other", "container_name": "app", "gpu": "x"},
             "value": [1.0, "1"]},
            {"metric": {"pod": "nolabels"}, "value": [1.0, "1"]}]}}"#;
        let read = samples(answer).expect("samples");
        assert_eq!(read.len(), 1);
        let mut rows = vec![
            crate::slices::tests::row("infer", 2),
            crate::slices::tests::row("idle", 2),
        ];
        attach(&mut rows, &BTreeMap::new(), &read);
        assert_eq!(rows[0].memory_used_mib, Some(1536.0));
        assert_eq!(
            (rows[1].memory_used_mib, rows[0].sm_used_percent),
            (None, None)
        );
        assert!(samples(r#"{"status": "error", "error": "bad query"}"#).is_err());
        assert!(samples("<html>").is_err());
    }
}
