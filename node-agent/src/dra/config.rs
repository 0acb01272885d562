//! The opaque configuration a claim (or its DeviceClass) gives the kit's driver, read without
//! I/O. One kind exists: `ShareConfig` (`apiVersion: <driver>/v1alpha1`), which sets the core
//! policy of a request's time-division shares:
//!
//! ```yaml
//! config:
//!   - requests: [gpu]
//!     opaque:
//!       driver: gpu.runtimekit.aliyun.com
//!       parameters:
//!         apiVersion: gpu.runtimekit.aliyun.com/v1alpha1
//!         kind: ShareConfig
//!         corePolicy: YieldIdle   # or Enforce (the node's default otherwise)
//! ```
//!
//! The apiserver checks only that parameters are a JSON object, so anything else a user writes
//! reaches the node: a claim whose configuration this driver cannot read fails its prepare
//! with a message saying what is wrong, before anything is made.

use super::claims::{Part, Planned};
use k8s_openapi::api::resource::v1::ResourceClaim;
use runtimekit_contract::dra::base_request;
use runtimekit_lj_runtime::config::CorePolicy;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The one kind of configuration the driver reads.
pub const SHARE_CONFIG: &str = "ShareConfig";

/// What configuration asks of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestConfig {
    /// The core policy of its shares; `None` keeps the node's.
    pub core_policy: Option<CorePolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ShareConfig {
    api_version: String,
    kind: String,
    #[serde(default)]
    core_policy: Option<CorePolicy>,
}

/// Each request's configuration, from the allocation's entries for `driver` in their order
/// (the class's before the claim's, a later one overriding an earlier one). An entry that names
/// a request must name one that got a share; one without requests applies to every share.
pub fn read(
    claim: &ResourceClaim,
    driver: &str,
    planned: &[Planned],
) -> Result<BTreeMap<String, RequestConfig>, String> {
    let entries = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_ref())
        .into_iter()
        .flatten();
    let shared: Vec<&str> = planned
        .iter()
        .filter(|p| matches!(p.part, Part::Share { .. }) && !p.admin)
        .map(|p| p.request.as_str())
        .collect();
    let mut configs: BTreeMap<String, RequestConfig> = BTreeMap::new();
    for (at, entry) in entries.enumerate() {
        let Some(opaque) = entry.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        let from = format!("configuration {at} ({})", entry.source);
        let config = parse(&opaque.parameters.0, driver).map_err(|e| format!("{from}: {e}"))?;
        let requests: Vec<&str> = match &entry.requests {
            Some(named) if !named.is_empty() => {
                let mut requests = Vec::new();
                for request in named {
                    let request = base_request(request);
                    if !shared.contains(&request) {
                        return Err(format!(
                            "{from}: {SHARE_CONFIG} applies to time-division shares, and request {request} got none"
                        ));
                    }
                    requests.push(request);
                }
                requests
            }
            _ => shared.clone(),
        };
        for request in requests {
            let slot = configs.entry(request.to_owned()).or_default();
            if config.core_policy.is_some() {
                slot.core_policy = config.core_policy;
            }
        }
    }
    Ok(configs)
}

/// One entry's parameters.
fn parse(parameters: &serde_json::Value, driver: &str) -> Result<RequestConfig, String> {
    let api_version = format!("{driver}/v1alpha1");
    let config: ShareConfig = serde_json::from_value(parameters.clone()).map_err(|e| {
        format!(
            "{e}; the driver reads {{apiVersion: {api_version}, kind: {SHARE_CONFIG}, corePolicy: Enforce|YieldIdle}}"
        )
    })?;
    if config.api_version != api_version || config.kind != SHARE_CONFIG {
        return Err(format!(
            "{}/{} is not a configuration this driver reads (it reads {api_version} {SHARE_CONFIG})",
            config.api_version, config.kind
        ));
    }
    Ok(RequestConfig {
        core_policy: config.core_policy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DRIVER: &str = "gpu.runtimekit.aliyun.com";

    fn planned(request: &str, share: bool) -> Planned {
        let part = if share {
            Part::Share {
                card: 0,
                uuid: "GPU-0".into(),
                core: Some(50),
                memory_mib: None,
            }
        } else {
            Part::Whole {
                card: 1,
                uuid: "GPU-1".into(),
            }
        };
        Planned {
            request: request.into(),
            device: "gpu-0-share".into(),
            part,
            admin: false,
        }
    }

    fn claim(config: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "n", "uid": "u"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [], "config": config}}},
        }))
        .unwrap()
    }

    fn share_config(policy: &str) -> serde_json::Value {
        json!({"apiVersion": format!("{DRIVER}/v1alpha1"), "kind": "ShareConfig", "corePolicy": policy})
    }

    #[test]
    fn a_claim_sets_its_shares_core_policy_over_its_class() {
        let object = claim(json!([
            {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": share_config("Enforce")}},
            {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": share_config("YieldIdle")}},
            {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {"anything": 1}}},
        ]));
        let configs = read(
            &object,
            DRIVER,
            &[planned("gpu", true), planned("card", false)],
        )
        .unwrap();
        assert_eq!(configs["gpu"].core_policy, Some(CorePolicy::YieldIdle));
        assert!(!configs.contains_key("card"), "{configs:?}");
    }

    #[test]
    fn no_configuration_keeps_the_nodes_policy() {
        let configs = read(&claim(json!([])), DRIVER, &[planned("gpu", true)]).unwrap();
        assert!(configs.is_empty());
    }

    #[test]
    fn malformed_configuration_is_refused_with_what_the_driver_reads() {
        for (parameters, expected) in [
            (
                json!({"apiVersion": format!("{DRIVER}/v1alpha1"), "kind": "ShareConfig", "corePolicy": "Sometimes"}),
                "unknown variant `Sometimes`",
            ),
            (
                json!({"apiVersion": format!("{DRIVER}/v1alpha1"), "kind": "ShareConfig", "cores": 3}),
                "unknown field `cores`",
            ),
            (json!({"kind": "ShareConfig"}), "missing field `apiVersion`"),
            (
                json!({"apiVersion": "v1", "kind": "ConfigMap"}),
                "v1/ConfigMap is not a configuration this driver reads",
            ),
            (json!([1, 2]), "invalid type"),
        ] {
            let object = claim(json!([
                {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}},
            ]));
            let error = read(&object, DRIVER, &[planned("gpu", true)]).unwrap_err();
            assert!(
                error.starts_with("configuration 0 (FromClaim): ") && error.contains(expected),
                "{error}"
            );
        }
    }

    #[test]
    fn a_share_configuration_for_a_whole_card_is_refused() {
        let object = claim(json!([
            {"source": "FromClaim", "requests": ["card"], "opaque": {"driver": DRIVER, "parameters": share_config("YieldIdle")}},
        ]));
        let error = read(&object, DRIVER, &[planned("card", false)]).unwrap_err();
        assert!(error.contains("request card got none"), "{error}");
    }
}
