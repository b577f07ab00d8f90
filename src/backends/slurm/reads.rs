//! [`SharedReads`]: concurrent association reads of the same accounts share one `sacctmgr show
//! assoc`. A caller never gets an answer read before it asked: it joins the next read, which
//! starts when the one in flight has ended, so everyone who asked meanwhile shares it. A thousand
//! `reconcile.user` jobs running together make a handful of reads instead of a thousand.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::{Association, Shared, Slurm, SlurmError};
use crate::domain::names::SlurmAccount;

/// A read's answer (or its error) and the effects it recorded.
type Answer = Option<(Result<Vec<Association>, Shared>, Vec<serde_json::Value>)>;

#[derive(Default)]
pub struct SharedReads {
    /// Reads asked for and not started yet, by accounts.
    next: Arc<Mutex<HashMap<String, watch::Receiver<Answer>>>>,
    /// Held by the read in flight.
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl SharedReads {
    pub async fn associations(
        &self,
        inner: &Arc<dyn Slurm>,
        accounts: &[SlurmAccount],
    ) -> Result<Vec<Association>, SlurmError> {
        let mut sorted: Vec<String> = accounts.iter().map(|a| a.to_string()).collect();
        sorted.sort_unstable();
        sorted.dedup();
        let key = sorted.join(",");
        let mut rx = {
            let mut next = self.next.lock().expect("reads");
            match next.get(&key).filter(|rx| rx.has_changed().is_ok()) {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    next.insert(key.clone(), rx.clone());
                    // its own task: a caller that gives up does not abandon the others
                    let (pending, turn, inner, accounts) =
                        (self.next.clone(), self.turn.clone(), inner.clone(), accounts.to_vec());
                    tokio::spawn(async move {
                        let _turn = turn.lock().await;
                        pending.lock().expect("reads").remove(&key);
                        let (r, effects) = crate::effects::collect(inner.associations(&accounts)).await;
                        let r = r.map_err(|e| e.shared());
                        tx.send_replace(Some((r, effects)));
                    });
                    rx
                }
            }
        };
        let answer = rx.wait_for(Option::is_some).await.map(|a| a.clone()).ok().flatten();
        match answer {
            Some((r, effects)) => {
                effects.into_iter().for_each(crate::effects::record);
                r.map_err(SlurmError::from)
            }
            None => Err(Shared::abandoned("shared read").into()),
        }
    }
}
