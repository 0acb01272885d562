//! What one pass of the GangGroup controller does to a gang, decided without I/O: from the gang,
//! what its members are doing and the time, the status to write and the actions to carry out.
//!
//! A pass either ends at once ([`Step::Done`]) or needs the members placed first
//! ([`Step::Place`]); then the controller reserves and binds them and finishes the pass with
//! [`reserved`], [`bound`] or [`unplaceable`], and each path ends in the timeout check.

use crate::backoff::Backoff;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use runtimekit_crds::{
    GangGroup, GangGroupStatus, GangMembers, GangPhase, GangPlacement, OnTimeout, set_condition,
};
use std::time::Duration;

/// The condition that latches once every member of the current attempt ran: a gang that ran
/// never times out for a late member.
pub const RAN: &str = "Ran";

/// The wait after a timed-out attempt before the next one.
const ATTEMPT_BACKOFF: Backoff = Backoff {
    first: Duration::from_secs(5),
    max: Duration::from_secs(300),
};

/// What a pass sees of the gang's members that count (pending, bound, running or succeeded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Members {
    /// Members that exist.
    pub seen: usize,
    /// Members bound, or whose binding is being written.
    pub bound: usize,
    /// Members running or completed successfully.
    pub running: usize,
}

/// Something a pass does besides writing the status, carried out in order before the write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Tell every member that has not heard this message yet why it waits.
    Report {
        /// The stable reason of the Event and condition.
        reason: &'static str,
        /// What happened.
        message: String,
    },
    /// Delete the bound members that have not finished, each with a UID precondition: only
    /// under `onTimeout: DeleteBoundMembers`.
    DeleteBound,
}

/// The status to write and what to do first.
#[derive(Debug, Clone, PartialEq)]
pub struct Pass {
    /// The gang's new status.
    pub status: GangGroupStatus,
    /// Actions to carry out before the status is written.
    pub actions: Vec<Action>,
    /// The phase the gang counts as in the metrics.
    pub phase: GangPhase,
}

/// The first half of a pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The pass is decided.
    Done(Pass),
    /// Reserve every pending member in one decision, then finish with [`reserved`] and
    /// [`bound`], or with [`unplaceable`].
    Place(GangGroupStatus),
}

/// Whether the gang waits out the backoff after a timed-out attempt at `now`; such a pass
/// places nothing and needs no size check.
pub fn backing_off(gang: &GangGroup, now: Timestamp) -> bool {
    gang.status
        .as_ref()
        .and_then(|s| s.attempt_start_time.as_ref())
        .is_some_and(|start| start.0 > now)
}

/// Starts a pass. `size_error` is the contract's message when the gang's min-member disagrees
/// with its JobSet.
pub fn next(
    gang: &GangGroup,
    members: Members,
    size_error: Option<String>,
    now: Timestamp,
) -> Step {
    let status = gang.status.clone().unwrap_or_default();
    let min = gang.spec.min_member as usize;
    let mut next = GangGroupStatus {
        members: Some(counts(members, members.bound)),
        observed_generation: gang.metadata.generation,
        ..status
    };
    if members.seen >= min && members.running >= min {
        next.phase = Some(GangPhase::Running);
        next.message = None;
        if !ran(&next) {
            set_condition(
                &mut next.conditions,
                condition(
                    RAN,
                    "True",
                    "AllMembersRunning",
                    "every member ran in this attempt",
                    now,
                ),
            );
        }
        return Step::Done(Pass {
            status: next,
            actions: Vec::new(),
            phase: GangPhase::Running,
        });
    }
    if backing_off(gang, now) {
        return Step::Done(Pass {
            status: next,
            actions: Vec::new(),
            phase: GangPhase::TimedOut,
        });
    }
    if next.attempt_start_time.is_none() || next.phase == Some(GangPhase::TimedOut) {
        next.attempt_start_time = Some(Time(now));
        next.phase = Some(GangPhase::Waiting);
        next.message = None;
    }
    if let Some(message) = size_error {
        next.phase = Some(GangPhase::Failed);
        next.message = Some(message.clone());
        return Step::Done(Pass {
            status: next,
            actions: vec![Action::Report {
                reason: "InvalidGang",
                message,
            }],
            phase: GangPhase::Failed,
        });
    }
    let mut actions = Vec::new();
    if members.seen < min {
        next.phase = Some(GangPhase::Waiting);
        let message = format!("waiting for members: {} of {min} exist", members.seen);
        next.message = Some(message.clone());
        actions.push(Action::Report {
            reason: "GangIncomplete",
            message,
        });
    } else if members.seen > members.bound {
        // Every pending member in one decision: the whole gang at first, then the members
        // whose binding failed or who replace members that ended.
        return Step::Place(next);
    } else {
        next.phase = Some(GangPhase::Bound);
        next.message = None;
    }
    Step::Done(time_out(gang, next, members, actions, now))
}

/// The pending members were reserved at `placement`, `reserved` of them: the status written
/// before their bindings.
pub fn reserved(
    status: GangGroupStatus,
    members: Members,
    placement: GangPlacement,
    reserved: usize,
) -> GangGroupStatus {
    GangGroupStatus {
        placement: Some(placement),
        phase: Some(GangPhase::Reserved),
        message: None,
        members: Some(counts(members, members.bound + reserved)),
        ..status
    }
}

/// Finishes a pass whose reserved members were bound, or not all of them: `failure` says why
/// some were not (they stay pending, hold nothing and are placed again; the others stay bound).
pub fn bound(
    gang: &GangGroup,
    mut status: GangGroupStatus,
    members: Members,
    failure: Option<String>,
    now: Timestamp,
) -> Pass {
    let mut actions = Vec::new();
    match failure {
        None => status.phase = Some(GangPhase::Bound),
        Some(why) => {
            status.phase = Some(GangPhase::Waiting);
            let message =
                format!("binding members failed ({why}); they stay pending and are placed again");
            status.message = Some(message.clone());
            actions.push(Action::Report {
                reason: "BindingFailed",
                message,
            });
        }
    }
    time_out(gang, status, members, actions, now)
}

/// Finishes a pass whose pending members do not fit together, for `message`.
pub fn unplaceable(
    gang: &GangGroup,
    mut status: GangGroupStatus,
    members: Members,
    message: String,
    now: Timestamp,
) -> Pass {
    status.phase = Some(GangPhase::Waiting);
    status.message = Some(message.clone());
    let report = Action::Report {
        reason: "Unschedulable",
        message,
    };
    time_out(gang, status, members, vec![report], now)
}

/// Ends every pass: an attempt that has not run within the timeout since it began is recorded,
/// its members are told why, and the next attempt waits out a backoff. Bound members are
/// deleted only under `onTimeout: DeleteBoundMembers`.
fn time_out(
    gang: &GangGroup,
    mut status: GangGroupStatus,
    members: Members,
    mut actions: Vec<Action>,
    now: Timestamp,
) -> Pass {
    let timeout = i64::from(gang.spec.timeout_seconds);
    let started = status.attempt_start_time.as_ref().map_or(now, |t| t.0);
    if !ran(&status) && now.as_second() - started.as_second() > timeout {
        status.attempts += 1;
        let backoff = ATTEMPT_BACKOFF.after(status.attempts);
        let delete = gang.spec.on_timeout == OnTimeout::DeleteBoundMembers && members.bound > 0;
        let bound = match members.bound {
            0 => "no member is bound, and nothing is held".to_owned(),
            n if delete => {
                format!("the {n} bound members are deleted (onTimeout: DeleteBoundMembers)")
            }
            n => format!(
                "the {n} bound members keep their cards (onTimeout: KeepBoundMembers; delete them to free the cards)"
            ),
        };
        let why = status
            .message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        let message = format!(
            "not complete and running within {timeout} s ({} of {} running, {} bound, {} exist){why}; {bound}; attempt {} starts in {} s",
            members.running,
            gang.spec.min_member,
            members.bound,
            members.seen,
            status.attempts + 1,
            backoff.as_secs()
        );
        status.phase = Some(GangPhase::TimedOut);
        status.message = Some(message.clone());
        actions.push(Action::Report {
            reason: "GangTimedOut",
            message,
        });
        if delete {
            actions.push(Action::DeleteBound);
        }
        let next_start = now
            .saturating_add(SignedDuration::try_from(backoff).unwrap_or_default())
            .unwrap_or(now);
        status.attempt_start_time = Some(Time(next_start));
        if members.bound == 0 || delete {
            status.placement = None;
        }
        set_condition(
            &mut status.conditions,
            condition(RAN, "False", "TimedOut", "the attempt timed out", now),
        );
    }
    let phase = status.phase.unwrap_or(GangPhase::Waiting);
    Pass {
        status,
        actions,
        phase,
    }
}

/// Whether `new` differs from `old` only in its member counts: a write a pass may put off for a
/// moment, so members turning Running one after another cost their gang one write, not one each.
pub fn only_counts_moved(old: Option<&GangGroupStatus>, new: &GangGroupStatus) -> bool {
    old.is_some_and(|old| {
        old.members != new.members
            && GangGroupStatus {
                members: new.members.clone(),
                ..old.clone()
            } == *new
    })
}

/// Whether every member of the current attempt ran.
fn ran(status: &GangGroupStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == RAN && c.status == "True")
}

fn counts(members: Members, reserved: usize) -> GangMembers {
    GangMembers {
        seen: count(members.seen),
        reserved: count(reserved),
        bound: count(members.bound),
        running: count(members.running),
    }
}

fn condition(type_: &str, status: &str, reason: &str, message: &str, now: Timestamp) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(now),
        observed_generation: None,
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
