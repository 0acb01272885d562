//! Drives watch streams into the [`State`](crate::state::State): every change is applied under
//! the state's lock, a re-list forgets objects that disappeared meanwhile, and the first complete
//! list of each kind is reported so the operator acts only on a full picture.

use crate::shared::Shared;
use futures::{StreamExt, TryStreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;

/// How one kind is applied to and removed from the state.
pub trait Mirrored: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static {
    /// The kind's name, for logs and the sync report.
    const KIND: &'static str;
    /// The key the state knows the object by.
    fn key(&self) -> String;
    /// Applies the object as it is now.
    fn apply(&self, shared: &Shared);
    /// Removes the object by key.
    fn remove(key: &str, shared: &Shared);
    /// Every key the state knows for this kind.
    fn known(shared: &Shared) -> Vec<String>;
    /// Called once the first complete list has been applied.
    fn synced(_shared: &Shared) {}
    /// Called after every complete list (the first and each re-list).
    fn relisted(_shared: &Shared) {}
}

/// Watches `api` forever (reconnecting with backoff) and mirrors it into `shared`.
pub async fn mirror<K: Mirrored>(api: Api<K>, config: watcher::Config, shared: Arc<Shared>) {
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
                object.apply(&shared);
            }
            Event::InitDone => {
                let keys = listed.take().unwrap_or_default();
                for gone in K::known(&shared).into_iter().filter(|k| !keys.contains(k)) {
                    K::remove(&gone, &shared);
                }
                K::relisted(&shared);
                if first_sync {
                    first_sync = false;
                    K::synced(&shared);
                    shared.mark_synced(K::KIND);
                    tracing::info!(kind = K::KIND, objects = keys.len(), "initial list applied");
                }
                shared.wake();
            }
            Event::Apply(object) => {
                object.apply(&shared);
                shared.wake();
            }
            Event::Delete(object) => {
                K::remove(&object.key(), &shared);
                shared.wake();
            }
        }
    }
}
