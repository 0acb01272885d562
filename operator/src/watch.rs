//! Drives watch streams into the [`State`](crate::state::State) through each kind's [`Feed`]:
//! every change is applied under the state's lock, a re-list forgets objects that disappeared
//! meanwhile, and the first complete list of each kind is reported so the operator acts only on
//! a full picture.

use crate::shared::Shared;
use crate::state::{Feed, Now};
use futures::{StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Watches `api` forever (reconnecting with backoff) and mirrors it into `shared`.
pub async fn mirror<K: Feed>(api: Api<K>, config: watcher::Config, shared: Arc<Shared>) {
    let mut listed: Option<BTreeSet<String>> = None;
    let mut first_sync = true;
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    loop {
        let event = match stream.try_next().await {
            Ok(Some(event)) => event,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(kind = K::KIND, %error, "watch failed; retrying");
                continue;
            }
        };
        match event {
            Event::Init => listed = Some(BTreeSet::new()),
            Event::InitApply(object) => {
                if let Some(keys) = listed.as_mut() {
                    keys.insert(object.key());
                }
                object.apply(&mut shared.lock(), Now::current());
            }
            Event::InitDone => {
                let keys = listed.take().unwrap_or_default();
                {
                    let mut state = shared.lock();
                    let now = Now::current();
                    for gone in K::known(&state).into_iter().filter(|k| !keys.contains(k)) {
                        K::remove(&gone, &mut state, now);
                    }
                    K::relisted(&mut state);
                    if first_sync {
                        K::synced(&mut state);
                    }
                }
                if first_sync {
                    first_sync = false;
                    shared.mark_synced(K::KIND);
                    tracing::info!(kind = K::KIND, objects = keys.len(), "initial list applied");
                }
                shared.wake();
            }
            Event::Apply(object) => {
                object.apply(&mut shared.lock(), Now::current());
                shared.wake();
            }
            Event::Delete(object) => {
                K::remove(&object.key(), &mut shared.lock(), Now::current());
                shared.wake();
            }
        }
    }
}
