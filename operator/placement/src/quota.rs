//! Namespace quotas on the card resources, counted as pods really hold them.
//!
//! A ResourceQuota counts a pod's requests once, but a pod labelled `replica: N` holds N cards'
//! shares: `gpu-core: 50` with `replica: 2` holds 100. The scheduler keeps a [`Quotas`] ledger
//! of what every pod that holds cards (bound and not ended, or decided and being written) holds,
//! counted with replicas, and refuses a pod whose namespace would then hold more than a quota's
//! hard limit. The apiserver's own quota admission is left as it is. Pure: the operator feeds it
//! from its watches, `kubectl gpu quota` from the cluster as listed.

use k8s_openapi::api::core::v1::{Container, Pod, ResourceQuota};
use runtimekit_contract::config::NVIDIA_GPU;
use runtimekit_contract::quantity::parse_whole;
use runtimekit_contract::{CardRequest, PodRequest, ResourceNames};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// The prefix a ResourceQuota's hard limits on extended resources carry (the only form the
/// apiserver accepts for them).
const REQUESTS: &str = "requests.";

/// The resource names a quota may limit that this ledger counts: the contract's card resources.
fn counted(names: &ResourceNames) -> [&str; 5] {
    [
        names.gpu_core.as_str(),
        names.gpu_memory.as_str(),
        names.gpu_slice.as_str(),
        names.gpu.as_str(),
        NVIDIA_GPU,
    ]
}

/// What a pod is, as far as quota scopes ask.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeFacts {
    /// `spec.priorityClassName`, empty when none.
    pub priority_class: String,
    /// Whether `spec.activeDeadlineSeconds` is set.
    pub terminating: bool,
    /// Whether no container requests or limits CPU or memory (QoS class BestEffort).
    pub best_effort: bool,
}

impl ScopeFacts {
    /// The facts of `pod`.
    pub fn of(pod: &Pod) -> ScopeFacts {
        let spec = pod.spec.as_ref();
        let compute = |c: &Container| {
            c.resources.as_ref().is_some_and(|r| {
                [r.requests.as_ref(), r.limits.as_ref()]
                    .into_iter()
                    .flatten()
                    .any(|list| list.contains_key("cpu") || list.contains_key("memory"))
            })
        };
        ScopeFacts {
            priority_class: spec
                .and_then(|s| s.priority_class_name.clone())
                .unwrap_or_default(),
            terminating: spec.is_some_and(|s| s.active_deadline_seconds.is_some()),
            best_effort: !spec.is_some_and(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
                    .any(compute)
            }),
        }
    }
}

/// What one pod holds of the counted resources, replicas counted, in each resource's own units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// Amount per resource name; only resources it holds some of.
    pub amounts: BTreeMap<String, i64>,
    /// What quota scopes ask of the pod.
    pub facts: ScopeFacts,
}

impl Holding {
    /// What `pod` holds once placed. `request` is its parsed request when it names our scheduler
    /// (then a time-division or MIG container holds its request once per replica); a pod of
    /// another scheduler holds its requests as written. Init containers count as the apiserver
    /// counts them: the larger of their peak and the regular containers' sum. `None` when it
    /// holds none of the counted resources; an amount that is not a whole number counts as 0
    /// (the apiserver and the contract refuse such pods anyway).
    pub fn of(pod: &Pod, request: Option<&PodRequest>, names: &ResourceNames) -> Option<Holding> {
        let spec = pod.spec.as_ref()?;
        let replicas = |container: &str| {
            request
                .and_then(|r| r.containers.iter().find(|c| c.container == container))
                .map_or(1, |c| match c.cards {
                    CardRequest::Tdm { cards, .. } | CardRequest::Mig { cards, .. } => {
                        i64::from(cards)
                    }
                    CardRequest::Whole { .. } => 1,
                })
        };
        let mut amounts = BTreeMap::new();
        for container in &spec.containers {
            for (name, amount) in requested(container, names) {
                *amounts.entry(name).or_insert(0) +=
                    amount.saturating_mul(replicas(&container.name));
            }
        }
        for container in spec.init_containers.iter().flatten() {
            for (name, amount) in requested(container, names) {
                let held = amounts.entry(name).or_insert(0);
                *held = (*held).max(amount);
            }
        }
        amounts.retain(|_, amount| *amount > 0);
        (!amounts.is_empty()).then(|| Holding {
            amounts,
            facts: ScopeFacts::of(pod),
        })
    }
}

/// A container's requests of the counted resources, falling back to its limits as the
/// apiserver defaults them.
fn requested(container: &Container, names: &ResourceNames) -> Vec<(String, i64)> {
    let Some(resources) = container.resources.as_ref() else {
        return Vec::new();
    };
    counted(names)
        .into_iter()
        .filter_map(|name| {
            let quantity = resources
                .requests
                .as_ref()
                .and_then(|r| r.get(name))
                .or_else(|| resources.limits.as_ref().and_then(|l| l.get(name)))?;
            Some((name.to_owned(), parse_whole(&quantity.0).unwrap_or(0)))
        })
        .collect()
}

/// A quota scope: which pods a quota counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Pods with `activeDeadlineSeconds`.
    Terminating,
    /// Pods without.
    NotTerminating,
    /// BestEffort pods.
    BestEffort,
    /// Every other pod.
    NotBestEffort,
    /// Pods by priority class: the selector's operator and values.
    PriorityClass {
        /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
        operator: String,
        /// The class names.
        values: Vec<String>,
    },
    /// Pods with cross-namespace pod affinity, which this scheduler never places.
    CrossNamespacePodAffinity,
}

impl Scope {
    fn matches(&self, facts: &ScopeFacts) -> bool {
        match self {
            Scope::Terminating => facts.terminating,
            Scope::NotTerminating => !facts.terminating,
            Scope::BestEffort => facts.best_effort,
            Scope::NotBestEffort => !facts.best_effort,
            Scope::PriorityClass { operator, values } => {
                let class = &facts.priority_class;
                match operator.as_str() {
                    "In" => values.contains(class),
                    "NotIn" => !values.contains(class),
                    "Exists" => !class.is_empty(),
                    "DoesNotExist" => class.is_empty(),
                    _ => false,
                }
            }
            Scope::CrossNamespacePodAffinity => false,
        }
    }

    fn parse(name: &str, operator: Option<&str>, values: Option<&Vec<String>>) -> Option<Scope> {
        Some(match name {
            "Terminating" => Scope::Terminating,
            "NotTerminating" => Scope::NotTerminating,
            "BestEffort" => Scope::BestEffort,
            "NotBestEffort" => Scope::NotBestEffort,
            "CrossNamespacePodAffinity" => Scope::CrossNamespacePodAffinity,
            "PriorityClass" => Scope::PriorityClass {
                operator: operator.unwrap_or("Exists").to_owned(),
                values: values.cloned().unwrap_or_default(),
            },
            _ => return None,
        })
    }
}

/// A ResourceQuota's limits on the counted resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// The ResourceQuota's name.
    pub name: String,
    /// Hard limit per counted resource name (without `requests.`).
    pub hard: BTreeMap<String, i64>,
    /// Every scope must match for a pod to count.
    pub scopes: Vec<Scope>,
}

impl Quota {
    /// The limits `quota` sets on the counted resources; `None` when it sets none, or names a
    /// scope this version does not know (it then counts nothing here rather than the wrong pods).
    pub fn from_resource_quota(quota: &ResourceQuota, names: &ResourceNames) -> Option<Quota> {
        let spec = quota.spec.as_ref()?;
        let counted = counted(names);
        let hard: BTreeMap<String, i64> = spec
            .hard
            .iter()
            .flatten()
            .filter_map(|(key, value)| {
                let name = key.strip_prefix(REQUESTS).filter(|n| counted.contains(n))?;
                Some((name.to_owned(), parse_whole(&value.0).ok()?))
            })
            .collect();
        if hard.is_empty() {
            return None;
        }
        let mut scopes = Vec::new();
        for name in spec.scopes.iter().flatten() {
            scopes.push(Scope::parse(name, None, None)?);
        }
        for expression in spec
            .scope_selector
            .iter()
            .flat_map(|s| s.match_expressions.iter().flatten())
        {
            scopes.push(Scope::parse(
                &expression.scope_name,
                Some(&expression.operator),
                expression.values.as_ref(),
            )?);
        }
        Some(Quota {
            name: quota.metadata.name.clone().unwrap_or_default(),
            hard,
            scopes,
        })
    }

    fn counts(&self, facts: &ScopeFacts) -> bool {
        self.scopes.iter().all(|s| s.matches(facts))
    }
}

/// A pod that would take its namespace past a quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "namespace {namespace} would hold {would} of its {hard} {resource} (ResourceQuota {quota}, each replica counted)"
)]
pub struct QuotaExceeded {
    /// The namespace.
    pub namespace: String,
    /// The ResourceQuota.
    pub quota: String,
    /// The resource name.
    pub resource: String,
    /// What the namespace would hold with the pod.
    pub would: i64,
    /// The quota's hard limit.
    pub hard: i64,
}

/// One quota's use of one resource, for views.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaUse {
    /// The namespace.
    pub namespace: String,
    /// The ResourceQuota.
    pub quota: String,
    /// The resource name.
    pub resource: String,
    /// What the namespace's pods hold, replicas counted.
    pub held: i64,
    /// The hard limit.
    pub hard: i64,
}

#[derive(Debug, Clone)]
struct Entry {
    quota: Quota,
    used: BTreeMap<String, i64>,
}

/// The quotas of every namespace and what its pods hold against them, kept incrementally.
#[derive(Debug, Default, Clone)]
pub struct Quotas {
    quotas: BTreeMap<String, BTreeMap<String, Entry>>,
    holdings: HashMap<String, (String, Arc<Holding>)>,
    by_namespace: BTreeMap<String, BTreeSet<String>>,
}

impl Quotas {
    /// Adds or replaces a namespace's quota; what it counts is summed from the holdings.
    /// Returns whether its limits or scopes changed: the quota controller rewrites a quota's
    /// status on every pod change in its namespace, and those writes change nothing here.
    pub fn upsert_quota(&mut self, namespace: &str, quota: Quota) -> bool {
        if self
            .quotas
            .get(namespace)
            .and_then(|entries| entries.get(&quota.name))
            .is_some_and(|entry| entry.quota == quota)
        {
            return false;
        }
        let mut used = BTreeMap::new();
        for uid in self.by_namespace.get(namespace).into_iter().flatten() {
            if let Some((_, holding)) = self.holdings.get(uid) {
                add(&mut used, &quota, holding, 1);
            }
        }
        let name = quota.name.clone();
        self.quotas
            .entry(namespace.to_owned())
            .or_default()
            .insert(name, Entry { quota, used });
        true
    }

    /// Forgets a quota; returns whether it was known.
    pub fn remove_quota(&mut self, namespace: &str, name: &str) -> bool {
        let Some(entries) = self.quotas.get_mut(namespace) else {
            return false;
        };
        let removed = entries.remove(name).is_some();
        if entries.is_empty() {
            self.quotas.remove(namespace);
        }
        removed
    }

    /// Every quota's key, as (namespace, name).
    pub fn quota_keys(&self) -> Vec<(String, String)> {
        self.quotas
            .iter()
            .flat_map(|(ns, entries)| entries.keys().map(move |name| (ns.clone(), name.clone())))
            .collect()
    }

    /// Records what pod `uid` of `namespace` holds, replacing what it held before (shared with
    /// the caller's record of the pod, so recording an unchanged pod again copies nothing).
    pub fn hold(&mut self, uid: &str, namespace: &str, holding: Arc<Holding>) {
        if self
            .holdings
            .get(uid)
            .is_some_and(|(ns, h)| ns == namespace && *h == holding)
        {
            return;
        }
        self.release(uid);
        if let Some(entries) = self.quotas.get_mut(namespace) {
            for entry in entries.values_mut() {
                add(&mut entry.used, &entry.quota, &holding, 1);
            }
        }
        self.by_namespace
            .entry(namespace.to_owned())
            .or_default()
            .insert(uid.to_owned());
        self.holdings
            .insert(uid.to_owned(), (namespace.to_owned(), holding));
    }

    /// Forgets what pod `uid` holds; returns whether it held anything.
    pub fn release(&mut self, uid: &str) -> bool {
        let Some((namespace, holding)) = self.holdings.remove(uid) else {
            return false;
        };
        if let Some(entries) = self.quotas.get_mut(&namespace) {
            for entry in entries.values_mut() {
                add(&mut entry.used, &entry.quota, &holding, -1);
            }
        }
        if let Some(uids) = self.by_namespace.get_mut(&namespace) {
            uids.remove(uid);
            if uids.is_empty() {
                self.by_namespace.remove(&namespace);
            }
        }
        true
    }

    /// Whether `namespace` may take `adding` (pods that hold nothing yet) on top of what it
    /// holds: the first quota and resource it would exceed, by name.
    pub fn check<'a>(
        &self,
        namespace: &str,
        adding: impl IntoIterator<Item = &'a Holding> + Clone,
    ) -> Result<(), QuotaExceeded> {
        let Some(entries) = self.quotas.get(namespace) else {
            return Ok(());
        };
        for entry in entries.values() {
            let mut would = entry.used.clone();
            for holding in adding.clone() {
                add(&mut would, &entry.quota, holding, 1);
            }
            for (resource, hard) in &entry.quota.hard {
                let held = would.get(resource).copied().unwrap_or(0);
                if held > *hard && held > entry.used.get(resource).copied().unwrap_or(0) {
                    return Err(QuotaExceeded {
                        namespace: namespace.to_owned(),
                        quota: entry.quota.name.clone(),
                        resource: resource.clone(),
                        would: held,
                        hard: *hard,
                    });
                }
            }
        }
        Ok(())
    }

    /// Every quota's use of each resource it limits, by namespace, quota and resource.
    pub fn usage(&self) -> Vec<QuotaUse> {
        self.quotas
            .iter()
            .flat_map(|(namespace, entries)| {
                entries.values().flat_map(move |entry| {
                    entry
                        .quota
                        .hard
                        .iter()
                        .map(move |(resource, hard)| QuotaUse {
                            namespace: namespace.clone(),
                            quota: entry.quota.name.clone(),
                            resource: resource.clone(),
                            held: entry.used.get(resource).copied().unwrap_or(0),
                            hard: *hard,
                        })
                })
            })
            .collect()
    }
}

/// Adds `sign` times what `holding` holds of `quota`'s resources to `used`, if the quota counts it.
fn add(used: &mut BTreeMap<String, i64>, quota: &Quota, holding: &Holding, sign: i64) {
    if !quota.counts(&holding.facts) {
        return;
    }
    for resource in quota.hard.keys() {
        if let Some(amount) = holding.amounts.get(resource) {
            let entry = used.entry(resource.clone()).or_insert(0);
            *entry = entry.saturating_add(amount.saturating_mul(sign));
        }
    }
}

#[cfg(test)]
mod tests;
