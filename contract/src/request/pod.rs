//! [`parse_pod`]: the pod's containers parsed one by one, then the rules of the pod as a whole:
//! no cards for init containers, the `replica` label, the scheduler and RuntimeClass, and the
//! gang labels.

use super::parser::Parser;
use super::{CardRequest, ContractError, MAX_CARDS, PodRequest, Violation, Warning};
use crate::config::{JOBSET_NAME_LABEL, REPLICA_LABEL, RuntimeKitConfig};
use k8s_openapi::api::core::v1::Pod;

/// Parses and checks a pod's GPU request against the contract, returning every rule it breaks.
pub fn parse_pod(pod: &Pod, config: &RuntimeKitConfig) -> Result<PodRequest, ContractError> {
    let names = config.names();
    let mut parser = Parser {
        config,
        names: &names,
        findings: Vec::new(),
        warnings: Vec::new(),
    };
    let spec = pod.spec.as_ref();
    let labels = pod.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);

    let scheduler = spec
        .and_then(|s| s.scheduler_name.as_deref())
        .unwrap_or("default-scheduler");
    let ours = scheduler == config.scheduler_name;
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let replica = label(REPLICA_LABEL).and_then(|v| parser.replica(v));

    for init in spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
    {
        if let Some(resource) = parser.first_gpu_resource(init) {
            parser.pod_finding(Violation::InitContainerCards {
                container: init.name.clone(),
                resource,
            });
        }
    }

    let mut containers = Vec::new();
    for container in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
        if let Some(request) = parser.container(container, replica.unwrap_or(1), host_network) {
            containers.push(request);
        }
    }

    if let Some(replica) = replica.filter(|&r| r > 1) {
        match containers
            .iter()
            .find(|c| matches!(c.cards, CardRequest::Whole { .. }))
        {
            Some(whole) => parser.pod_finding(Violation::ReplicaWithWholeCards {
                label: REPLICA_LABEL.into(),
                replica,
                container: whole.container.clone(),
                whole: names.gpu.clone(),
            }),
            None if containers.is_empty() => parser.pod_finding(Violation::ReplicaWithoutShares {
                label: REPLICA_LABEL.into(),
                replica,
                core: names.gpu_core.clone(),
                memory: names.gpu_memory.clone(),
                slice: names.gpu_slice.clone(),
            }),
            None => {}
        }
    }

    if !containers.is_empty() {
        if ours {
            let got = spec.and_then(|s| s.runtime_class_name.as_deref());
            if got != Some(config.runtime_class_name.as_str()) {
                parser.pod_finding(Violation::WrongRuntimeClass {
                    expected: config.runtime_class_name.clone(),
                    got: got.map_or_else(|| "none".into(), |g| format!("{g:?}")),
                });
            }
        } else if let Some(shared) = containers
            .iter()
            .find(|c| !matches!(c.cards, CardRequest::Whole { .. }))
        {
            let resource = match shared.cards {
                CardRequest::Mig { .. } => names.gpu_slice.clone(),
                _ => names.gpu_core.clone(),
            };
            parser.pod_finding(Violation::SharesNeedOurScheduler {
                resource,
                expected: config.scheduler_name.clone(),
                got: scheduler.into(),
            });
        }
    }

    let gang = label(&names.min_member_label)
        .and_then(|value| {
            parser.gang(
                value,
                label(JOBSET_NAME_LABEL),
                label(&names.gang_name_label),
            )
        })
        .filter(|gang| {
            config.features.gangs || {
                parser.warnings.push(Warning::GangsSwitchedOff {
                    gang: gang.name.clone(),
                });
                false
            }
        });

    if parser.findings.is_empty() {
        Ok(PodRequest {
            ours,
            containers,
            gang,
            host_network,
            warnings: parser.warnings,
        })
    } else {
        Err(ContractError {
            findings: parser.findings,
        })
    }
}

impl Parser<'_> {
    /// Reads the `replica` label: how many cards share one time-division or MIG configuration.
    fn replica(&mut self, value: &str) -> Option<u32> {
        match value.trim().parse::<u32>() {
            Ok(n @ 1..=MAX_CARDS) => Some(n),
            _ => {
                self.pod_finding(Violation::ReplicaInvalid {
                    label: REPLICA_LABEL.into(),
                    value: value.into(),
                    max: MAX_CARDS,
                });
                None
            }
        }
    }
}
