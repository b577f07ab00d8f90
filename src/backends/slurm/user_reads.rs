//! [`SharedUserReads`]: concurrent reads of single users become one `sacctmgr show user … withassoc`
//! of all of them. As with [`super::reads::SharedReads`], a caller never gets an answer read
//! before it asked: it joins the next read, which starts when the one in flight has ended and
//! takes every user asked for meanwhile (a thousand onboardings reading their association back
//! made a thousand reads, each a `sacctmgr` process against slurmdbd).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::{Shared, Slurm, SlurmError, UserState};
use crate::domain::names::Username;

/// Users named in one `sacctmgr` call at most (its argv, or the exec request's URL, stays short).
const PER_READ: usize = 200;

type Answer = Option<(Result<Arc<BTreeMap<String, UserState>>, Shared>, Vec<serde_json::Value>)>;

struct Next {
    users: Vec<Username>,
    done: watch::Receiver<Answer>,
}

#[derive(Default)]
pub struct SharedUserReads {
    /// The read asked for and not started yet.
    next: Arc<Mutex<Option<Next>>>,
    /// Held by the read in flight.
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl SharedUserReads {
    pub async fn user(&self, inner: &Arc<dyn Slurm>, user: &Username) -> Result<Option<UserState>, SlurmError> {
        let mut rx = {
            let mut next = self.next.lock().expect("user reads");
            match next.as_mut().filter(|n| n.done.has_changed().is_ok()) {
                Some(n) => {
                    if !n.users.contains(user) {
                        n.users.push(user.clone());
                    }
                    n.done.clone()
                }
                None => {
                    let (tx, rx) = watch::channel(None);
                    *next = Some(Next { users: vec![user.clone()], done: rx.clone() });
                    // its own task: a caller that gives up does not abandon the others
                    let (pending, turn, inner) = (self.next.clone(), self.turn.clone(), inner.clone());
                    tokio::spawn(async move {
                        let _turn = turn.lock().await;
                        let users = pending.lock().expect("user reads").take().map(|n| n.users).unwrap_or_default();
                        let (r, effects) = crate::effects::collect(read_all(&inner, &users)).await;
                        tx.send_replace(Some((r.map(Arc::new).map_err(|e| e.shared()), effects)));
                    });
                    rx
                }
            }
        };
        let answer = rx.wait_for(Option::is_some).await.map(|a| a.clone()).ok().flatten();
        match answer {
            Some((r, effects)) => {
                effects.into_iter().for_each(crate::effects::record);
                Ok(r.map_err(SlurmError::from)?.get(user.as_str()).cloned())
            }
            None => Err(Shared::abandoned("shared user read").into()),
        }
    }
}

async fn read_all(inner: &Arc<dyn Slurm>, users: &[Username]) -> Result<BTreeMap<String, UserState>, SlurmError> {
    let mut all = BTreeMap::new();
    for chunk in users.chunks(PER_READ) {
        all.extend(inner.users(chunk).await?);
    }
    Ok(all)
}
