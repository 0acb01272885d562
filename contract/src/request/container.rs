//! One container's GPU resources, read and checked: each limited, with a request equal to its
//! limit, named as this project defines, a non-negative whole number; then the RDMA switch.

use super::parser::Parser;
use super::{ContainerRequest, Violation, Warning};
use crate::config::NVIDIA_GPU;
use crate::quantity::{QuantityError, parse_whole};
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// The whole-number GPU resources of one container, before the rules between them.
#[derive(Default)]
pub(super) struct Values {
    pub(super) core: Option<i64>,
    pub(super) memory: Option<i64>,
    pub(super) slice: Option<i64>,
    pub(super) any_vendor: Option<i64>,
    pub(super) nvidia: Option<i64>,
    pub(super) rdma: Option<i64>,
}

impl Parser<'_> {
    /// The first GPU resource a container mentions in limits or requests.
    pub(super) fn first_gpu_resource(&self, container: &Container) -> Option<String> {
        let resources = container.resources.as_ref()?;
        [resources.limits.as_ref(), resources.requests.as_ref()]
            .into_iter()
            .flatten()
            .flat_map(BTreeMap::keys)
            .find(|name| self.names.is_gpu_resource(name))
            .cloned()
    }

    /// Reads and checks one container's GPU resources; `None` when it asks for no cards or
    /// breaks a rule.
    pub(super) fn container(
        &mut self,
        container: &Container,
        replica: u32,
        host_network: bool,
    ) -> Option<ContainerRequest> {
        let name = container.name.as_str();
        let empty = BTreeMap::new();
        let resources = container.resources.as_ref();
        let limits = resources.and_then(|r| r.limits.as_ref()).unwrap_or(&empty);
        let requests = resources
            .and_then(|r| r.requests.as_ref())
            .unwrap_or(&empty);
        let before = self.findings.len();
        let names = self.names;

        for (resource, request) in requests.iter().filter(|(r, _)| names.is_gpu_resource(r)) {
            match limits.get(resource) {
                None => self.finding(
                    name,
                    Violation::RequestWithoutLimit {
                        resource: resource.clone(),
                    },
                ),
                Some(limit) if !same_quantity(limit, request) => self.finding(
                    name,
                    Violation::RequestNotLimit {
                        resource: resource.clone(),
                        request: request.0.clone(),
                        limit: limit.0.clone(),
                    },
                ),
                Some(_) => {}
            }
        }

        let mut values = Values::default();
        for (resource, quantity) in limits.iter().filter(|(r, _)| names.is_gpu_resource(r)) {
            let slot = match resource.as_str() {
                r if r == names.gpu_core => &mut values.core,
                r if r == names.gpu_memory => &mut values.memory,
                r if r == names.gpu_slice => &mut values.slice,
                r if r == names.gpu => &mut values.any_vendor,
                r if r == names.rdma => &mut values.rdma,
                NVIDIA_GPU => &mut values.nvidia,
                unknown => {
                    let known = names.own_resources().join(", ");
                    self.finding(
                        name,
                        Violation::UnknownResource {
                            resource: unknown.into(),
                            known: format!("{known}, {NVIDIA_GPU}"),
                        },
                    );
                    continue;
                }
            };
            match parse_whole(&quantity.0) {
                Ok(v) if v < 0 => self.finding(
                    name,
                    Violation::Negative {
                        resource: resource.clone(),
                        value: v,
                    },
                ),
                Ok(v) => *slot = Some(v),
                Err(
                    QuantityError::Malformed | QuantityError::Fractional | QuantityError::TooLarge,
                ) => self.finding(
                    name,
                    Violation::NotWhole {
                        resource: resource.clone(),
                        value: quantity.0.clone(),
                    },
                ),
            }
        }

        let request = self.card_request(name, &values, replica);
        let rdma = self.rdma(name, values.rdma, request.is_some());
        if rdma && !host_network {
            self.warnings.push(Warning::RdmaWithoutHostNetwork {
                container: name.into(),
                resource: self.names.rdma.clone(),
            });
        }
        if self.findings.len() > before {
            return None;
        }
        request.map(|cards| ContainerRequest {
            container: name.into(),
            cards,
            rdma,
        })
    }

    /// Reads the RDMA switch: 0 or 1, and 1 only beside cards.
    fn rdma(&mut self, container: &str, value: Option<i64>, has_cards: bool) -> bool {
        let resource = self.names.rdma.clone();
        match value {
            None | Some(0) => false,
            Some(1) if has_cards => true,
            Some(1) => {
                self.finding(container, Violation::RdmaWithoutCards { resource });
                false
            }
            Some(value) => {
                self.finding(container, Violation::RdmaInvalid { resource, value });
                false
            }
        }
    }
}

/// Whether two quantities have the same value (`1` and `1000m` do); unparsable ones must match
/// as text.
fn same_quantity(a: &Quantity, b: &Quantity) -> bool {
    match (parse_whole(&a.0), parse_whole(&b.0)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a.0.trim() == b.0.trim(),
    }
}
