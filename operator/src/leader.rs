//! Leader election on a `coordination.k8s.io/v1` Lease: only the holder acts, a standby takes
//! over once the holder stops renewing, and a holder that cannot renew in time steps down.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Timing of the election. With the defaults a standby takes over at most 12 s after the holder
/// dies: the lease lasts 10 s and standbys look every 2 s.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// How long the holder keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often everyone tries to acquire or renew.
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease_duration: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(7),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// One candidate for leadership.
#[derive(Clone)]
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("lease", &self.name)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// Why leadership ended.
#[derive(Debug, thiserror::Error)]
pub enum LeadershipLost {
    /// Renewals failed for longer than the renew deadline.
    #[error("could not renew lease {lease} for {elapsed:?}: {last_error}")]
    RenewDeadline {
        lease: String,
        elapsed: Duration,
        last_error: String,
    },
    /// Another candidate holds the lease now.
    #[error("lease {lease} was taken by {holder}")]
    Taken { lease: String, holder: String },
}

/// The record as this candidate last saw it, to judge expiry by local time (clocks of other
/// candidates may be skewed).
struct Observed {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    at: Instant,
}

impl Elector {
    /// A candidate `identity` for the Lease `namespace/name`.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: Timing,
    ) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            timing,
        }
    }

    /// Runs the election forever: waits to acquire the lease, sets `leading` to true, renews
    /// it, and returns when leadership is lost (the caller should stop acting, usually by exiting).
    pub async fn run(&self, leading: watch::Sender<bool>) -> LeadershipLost {
        let mut observed: Option<Observed> = None;
        let mut last_renewal = Instant::now();
        loop {
            let attempt = self.try_acquire_or_renew(&mut observed).await;
            let is_leader = *leading.borrow();
            match attempt {
                Ok(true) => {
                    last_renewal = Instant::now();
                    if !is_leader {
                        tracing::info!(lease = %self.name, identity = %self.identity, "acquired leadership");
                        leading.send_replace(true);
                    }
                }
                Ok(false) if is_leader => {
                    let holder = observed
                        .as_ref()
                        .and_then(|o| o.holder.clone())
                        .unwrap_or_default();
                    leading.send_replace(false);
                    return LeadershipLost::Taken {
                        lease: self.name.clone(),
                        holder,
                    };
                }
                Ok(false) => {}
                Err(e) if is_leader && last_renewal.elapsed() > self.timing.renew_deadline => {
                    leading.send_replace(false);
                    return LeadershipLost::RenewDeadline {
                        lease: self.name.clone(),
                        elapsed: last_renewal.elapsed(),
                        last_error: e.to_string(),
                    };
                }
                Err(e) => tracing::warn!(lease = %self.name, error = %e, "lease attempt failed"),
            }
            tokio::time::sleep(self.timing.retry_period).await;
        }
    }

    /// Gives the lease up so a standby takes over at once (on an orderly shutdown).
    pub async fn release(&self) {
        let Ok(mut lease) = self.api.get(&self.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        if let Err(e) = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(lease = %self.name, error = %e, "could not release the lease");
        }
    }

    /// One round: returns whether this candidate holds the lease afterwards.
    async fn try_acquire_or_renew(
        &self,
        observed: &mut Option<Observed>,
    ) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let duration = i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let changed = observed
            .as_ref()
            .is_none_or(|o| o.holder != holder || o.renew_time != spec.renew_time);
        if changed {
            *observed = Some(Observed {
                holder: holder.clone(),
                renew_time: spec.renew_time.clone(),
                at: Instant::now(),
            });
        }
        let mine = holder.as_deref() == Some(self.identity.as_str());
        let expired = holder.is_none()
            || observed
                .as_ref()
                .is_some_and(|o| o.at.elapsed() > self.timing.lease_duration);
        if !mine && !expired {
            return Ok(false);
        }
        if !mine {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(duration);
        // The replace carries the resourceVersion read above, so two candidates racing for an
        // expired lease cannot both win.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}
