//! The gang labels (`min-member` and the group it names: the JobSet, or the explicit gang-name
//! label) and [`check_gang_size`], which holds a JobSet gang to what runs its pods.

use super::parser::Parser;
use super::{GangMembership, Violation};
use crate::config::ResourceNames;

impl Parser<'_> {
    /// Reads the `min-member` label and the group it belongs to.
    pub(super) fn gang(
        &mut self,
        min_member: &str,
        job_set: Option<&str>,
        gang_name: Option<&str>,
    ) -> Option<GangMembership> {
        let label = self.names.min_member_label.clone();
        let min_member = match min_member.trim().parse::<u32>() {
            Ok(n) if n >= 1 => n,
            _ => {
                self.pod_finding(Violation::MinMemberInvalid {
                    label,
                    value: min_member.into(),
                });
                return None;
            }
        };
        let job_set = job_set.filter(|j| !j.is_empty());
        match gang_name.filter(|g| !g.is_empty()).or(job_set) {
            Some(name) => Some(GangMembership {
                name: name.into(),
                job_set: job_set.map(Into::into),
                min_member,
            }),
            None => {
                self.pod_finding(Violation::GangWithoutGroup {
                    label,
                    gang_label: self.names.gang_name_label.clone(),
                });
                None
            }
        }
    }
}

/// Checks a JobSet gang's size: `aliyun.com/min-member` must equal the number of pods with the
/// label that `runner` (`JobSet "name"` or `replicated job "name"`) runs at once, or the gang
/// could never be complete (or would start partially).
pub fn check_gang_size(
    names: &ResourceNames,
    gang: &GangMembership,
    runner: &str,
    parallelism: i32,
) -> Result<(), Violation> {
    if i64::from(gang.min_member) == i64::from(parallelism) {
        return Ok(());
    }
    Err(Violation::MinMemberNotParallelism {
        label: names.min_member_label.clone(),
        min_member: gang.min_member,
        runner: runner.into(),
        parallelism,
    })
}
