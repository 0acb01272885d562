//! The state one parse of a pod carries. Each rule's module adds its own methods to [`Parser`].

use super::{Finding, Violation, Warning};
use crate::config::{ResourceNames, RuntimeKitConfig};

/// The configuration a parse reads, and every finding and warning so far: a parse goes on
/// after a finding, so the user sees all that is wrong at once.
pub(super) struct Parser<'a> {
    pub(super) config: &'a RuntimeKitConfig,
    pub(super) names: &'a ResourceNames,
    pub(super) findings: Vec<Finding>,
    pub(super) warnings: Vec<Warning>,
}

impl Parser<'_> {
    /// Records a finding about the pod as a whole.
    pub(super) fn pod_finding(&mut self, violation: Violation) {
        self.findings.push(Finding {
            container: None,
            violation,
        });
    }

    /// Records a finding in `container`.
    pub(super) fn finding(&mut self, container: &str, violation: Violation) {
        self.findings.push(Finding {
            container: Some(container.into()),
            violation,
        });
    }
}
