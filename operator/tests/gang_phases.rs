//! The GangGroup state machine (`gangs::next`) without an apiserver: every phase a gang passes
//! through, the timeout with its backoff, what a timed-out attempt does to bound members under
//! each `onTimeout`, and the latch that keeps a gang that ran from timing out.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use runtimekit_crds::{
    GangGroup, GangGroupSpec, GangGroupStatus, GangPhase, GangPlacement, OnTimeout, Tier,
};
use runtimekit_operator::gangs::next::{
    self, Action, Members, Pass, RAN, Step, backing_off, bound, only_counts_moved, reserved,
    unplaceable,
};

const TIMEOUT: u32 = 60;

fn gang(status: Option<GangGroupStatus>) -> GangGroup {
    gang_on_timeout(status, OnTimeout::KeepBoundMembers)
}

fn gang_on_timeout(status: Option<GangGroupStatus>, on_timeout: OnTimeout) -> GangGroup {
    let mut gang = GangGroup::new(
        "train",
        GangGroupSpec {
            min_member: 4,
            timeout_seconds: TIMEOUT,
            highest_tier: Tier::NetworkPod,
            job_set: None,
            on_timeout,
        },
    );
    gang.status = status;
    gang
}

fn at(seconds: i64) -> Timestamp {
    Timestamp::UNIX_EPOCH + SignedDuration::from_secs(1_000_000 + seconds)
}

fn placement() -> GangPlacement {
    GangPlacement {
        tier: Tier::LeafSwitch,
        group: "leaf-a".into(),
        nodes: vec!["node-1".into(), "node-2".into()],
    }
}

fn members(seen: usize, bound: usize, running: usize) -> Members {
    Members {
        seen,
        bound,
        running,
    }
}

fn done(step: Step) -> Pass {
    match step {
        Step::Done(pass) => pass,
        Step::Place(status) => unreachable!("expected a decided pass, got Place with {status:?}"),
    }
}

/// A pass over `gang`'s four pending members that finds no room for them.
fn placed_nowhere(gang: &GangGroup, now: Timestamp) -> Pass {
    match next::next(gang, members(4, 0, 0), None, now) {
        Step::Place(status) => unplaceable(gang, status, members(4, 0, 0), "no room".into(), now),
        Step::Done(pass) => unreachable!("pending members are placed on every pass: {pass:?}"),
    }
}

fn ran(status: &GangGroupStatus) -> Option<&str> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == RAN)
        .map(|c| c.status.as_str())
}

#[test]
fn only_a_change_of_counts_alone_may_wait() {
    let bound_gang = gang(None);
    let placed = match next::next(&bound_gang, members(4, 0, 0), None, at(0)) {
        Step::Place(status) => reserved(status, members(4, 0, 0), placement(), 4),
        Step::Done(pass) => unreachable!("{pass:?}"),
    };
    let bound = bound(&bound_gang, placed, members(4, 0, 0), None, at(0)).status;
    let mut more_running = bound.clone();
    more_running.members.as_mut().expect("counts").running = 2;
    assert!(only_counts_moved(Some(&bound), &more_running));
    assert!(!only_counts_moved(Some(&bound), &bound), "nothing moved");
    assert!(
        !only_counts_moved(None, &bound),
        "a first status is written at once"
    );
    let mut running = more_running.clone();
    running.phase = Some(GangPhase::Running);
    assert!(
        !only_counts_moved(Some(&bound), &running),
        "a new phase is written at once"
    );
    let mut told = more_running;
    told.message = Some("why".into());
    assert!(
        !only_counts_moved(Some(&bound), &told),
        "a new message is written at once"
    );
}

#[test]
fn a_new_gang_starts_its_attempt_and_waits_for_members() {
    let pass = done(next::next(&gang(None), members(2, 0, 0), None, at(0)));
    assert_eq!(pass.phase, GangPhase::Waiting);
    assert_eq!(pass.status.attempt_start_time, Some(Time(at(0))));
    assert_eq!(
        pass.actions,
        [Action::Report {
            reason: "GangIncomplete",
            message: "waiting for members: 2 of 4 exist".into()
        }]
    );
    let counts = pass.status.members.expect("members");
    assert_eq!((counts.seen, counts.bound), (2, 0));
}

#[test]
fn a_size_error_fails_the_gang() {
    let pass = done(next::next(
        &gang(None),
        members(4, 0, 0),
        Some("min-member 4 but the JobSet runs 7".into()),
        at(0),
    ));
    assert_eq!(pass.phase, GangPhase::Failed);
    assert_eq!(pass.status.phase, Some(GangPhase::Failed));
    assert!(matches!(
        &pass.actions[..],
        [Action::Report {
            reason: "InvalidGang",
            ..
        }]
    ));
}

#[test]
fn a_complete_gang_is_placed_reserved_then_bound() {
    let Step::Place(status) = next::next(&gang(None), members(4, 0, 0), None, at(1)) else {
        panic!("four pending members of four are placed");
    };
    let status = reserved(status, members(4, 0, 0), placement(), 4);
    assert_eq!(status.phase, Some(GangPhase::Reserved));
    assert_eq!(status.placement, Some(placement()));
    assert_eq!(status.members.as_ref().map(|m| m.reserved), Some(4));
    let pass = bound(&gang(None), status, members(4, 0, 0), None, at(1));
    assert_eq!(pass.phase, GangPhase::Bound);
    assert!(pass.actions.is_empty());
}

#[test]
fn a_failed_binding_leaves_the_gang_waiting_with_the_reason() {
    let Step::Place(status) = next::next(&gang(None), members(4, 0, 0), None, at(1)) else {
        panic!("placed");
    };
    let status = reserved(status, members(4, 0, 0), placement(), 4);
    let pass = bound(
        &gang(None),
        status,
        members(4, 0, 0),
        Some("conflict".into()),
        at(1),
    );
    assert_eq!(pass.phase, GangPhase::Waiting);
    let message = "binding members failed (conflict); they stay pending and are placed again";
    assert_eq!(pass.status.message.as_deref(), Some(message));
    assert_eq!(
        pass.actions,
        [Action::Report {
            reason: "BindingFailed",
            message: message.into()
        }]
    );
    // The members that were bound stay; the next pass places the others.
    assert!(matches!(
        next::next(&gang(Some(pass.status)), members(4, 3, 0), None, at(2)),
        Step::Place(_)
    ));
}

#[test]
fn a_gang_that_does_not_fit_tells_its_members_why() {
    let Step::Place(status) = next::next(&gang(None), members(4, 0, 0), None, at(1)) else {
        panic!("placed");
    };
    let pass = unplaceable(
        &gang(None),
        status,
        members(4, 0, 0),
        "no room".into(),
        at(1),
    );
    assert_eq!(pass.phase, GangPhase::Waiting);
    assert_eq!(
        pass.actions,
        [Action::Report {
            reason: "Unschedulable",
            message: "no room".into()
        }]
    );
}

#[test]
fn bound_members_that_all_run_latch_ran() {
    let started = done(next::next(&gang(None), members(4, 4, 0), None, at(0))).status;
    assert_eq!(started.phase, Some(GangPhase::Bound));
    let pass = done(next::next(
        &gang(Some(started)),
        members(4, 4, 4),
        None,
        at(10),
    ));
    assert_eq!(pass.phase, GangPhase::Running);
    assert_eq!(ran(&pass.status), Some("True"));
    // Past the timeout, a gang that ran never times out, even with a member gone.
    let later = done(next::next(
        &gang_on_timeout(Some(pass.status.clone()), OnTimeout::DeleteBoundMembers),
        members(3, 3, 3),
        None,
        at(i64::from(TIMEOUT) * 3),
    ));
    assert!(later.actions.iter().all(|a| !matches!(
        a,
        Action::DeleteBound
            | Action::Report {
                reason: "GangTimedOut",
                ..
            }
    )));
    assert_eq!(later.phase, GangPhase::Waiting);
    // The replacement of a failed member is placed alone, the others staying bound.
    assert!(matches!(
        next::next(
            &gang(Some(pass.status)),
            members(4, 3, 3),
            None,
            at(i64::from(TIMEOUT) * 3)
        ),
        Step::Place(_)
    ));
}

/// The pass at `seconds` over a gang whose four members are bound, one running, since 0.
fn bound_not_running(on_timeout: OnTimeout, seconds: i64) -> Pass {
    let started = done(next::next(&gang(None), members(4, 4, 0), None, at(0))).status;
    done(next::next(
        &gang_on_timeout(Some(started), on_timeout),
        members(4, 4, 1),
        None,
        at(seconds),
    ))
}

#[test]
fn a_timed_out_attempt_keeps_bound_members_by_default() {
    let within = bound_not_running(OnTimeout::KeepBoundMembers, i64::from(TIMEOUT));
    assert!(within.actions.is_empty(), "not past the timeout yet");
    let pass = bound_not_running(OnTimeout::KeepBoundMembers, i64::from(TIMEOUT) + 1);
    assert_eq!(pass.phase, GangPhase::TimedOut);
    assert_eq!(pass.status.attempts, 1);
    let message = "not complete and running within 60 s (1 of 4 running, 4 bound, 4 exist); the 4 bound members keep their cards (onTimeout: KeepBoundMembers; delete them to free the cards); attempt 2 starts in 5 s";
    assert_eq!(pass.status.message.as_deref(), Some(message));
    assert_eq!(
        pass.actions,
        [Action::Report {
            reason: "GangTimedOut",
            message: message.into()
        }],
        "nothing is deleted"
    );
    assert_eq!(ran(&pass.status), Some("False"));
}

#[test]
fn a_timed_out_attempt_deletes_bound_members_only_when_the_gang_opts_in() {
    let pass = bound_not_running(OnTimeout::DeleteBoundMembers, i64::from(TIMEOUT) + 1);
    assert_eq!(pass.phase, GangPhase::TimedOut);
    assert_eq!(pass.actions.last(), Some(&Action::DeleteBound));
    assert_eq!(pass.status.placement, None);
    assert!(
        pass.status.message.as_deref().is_some_and(
            |m| m.contains("the 4 bound members are deleted (onTimeout: DeleteBoundMembers)")
        ),
        "{:?}",
        pass.status.message
    );
}

#[test]
fn the_timeout_records_the_attempt_and_backs_off_doubling() {
    let first = placed_nowhere(&gang(None), at(0));
    assert_eq!(first.phase, GangPhase::Waiting);
    let first = placed_nowhere(&gang(Some(first.status)), at(i64::from(TIMEOUT) + 1));
    assert_eq!(first.phase, GangPhase::TimedOut);
    assert_eq!(first.status.attempts, 1);
    assert_eq!(first.status.placement, None);
    assert_eq!(ran(&first.status), Some("False"));
    let restart = at(i64::from(TIMEOUT) + 1 + 5);
    assert_eq!(first.status.attempt_start_time, Some(Time(restart)));
    let message = "not complete and running within 60 s (0 of 4 running, 0 bound, 4 exist): no room; no member is bound, and nothing is held; attempt 2 starts in 5 s";
    assert_eq!(first.status.message.as_deref(), Some(message));
    assert_eq!(
        first.actions.last(),
        Some(&Action::Report {
            reason: "GangTimedOut",
            message: message.into()
        })
    );
    assert!(!first.actions.contains(&Action::DeleteBound));

    // During the backoff nothing is placed and nothing is reported.
    let waiting = gang(Some(first.status.clone()));
    assert!(backing_off(
        &waiting,
        restart - SignedDuration::from_secs(1)
    ));
    let pass = done(next::next(
        &waiting,
        members(4, 0, 0),
        Some("ignored while backing off".into()),
        restart - SignedDuration::from_secs(1),
    ));
    assert_eq!(pass.phase, GangPhase::TimedOut);
    assert!(pass.actions.is_empty());

    // The next attempt starts after it, and its own timeout backs off twice as long.
    assert!(!backing_off(&waiting, restart));
    let second = placed_nowhere(&waiting, restart);
    assert_eq!(second.phase, GangPhase::Waiting);
    assert_eq!(second.status.attempt_start_time, Some(Time(restart)));
    let past = restart + SignedDuration::from_secs(i64::from(TIMEOUT) + 1);
    let timed_out = placed_nowhere(&gang(Some(second.status)), past);
    assert_eq!(timed_out.status.attempts, 2);
    assert!(
        timed_out
            .status
            .message
            .as_deref()
            .is_some_and(|m| m.ends_with("attempt 3 starts in 10 s"))
    );
}

#[test]
fn members_that_run_during_the_backoff_end_it() {
    let pass = bound_not_running(OnTimeout::KeepBoundMembers, i64::from(TIMEOUT) + 1);
    let running = done(next::next(
        &gang(Some(pass.status)),
        members(4, 4, 4),
        None,
        at(i64::from(TIMEOUT) + 2),
    ));
    assert_eq!(running.phase, GangPhase::Running);
    assert_eq!(ran(&running.status), Some("True"));
    assert_eq!(
        running.status.attempts, 1,
        "the timed-out attempt stays recorded"
    );
}
