//! [`Coalesced`]: concurrent reads that can be answered by one `sacctmgr` call share it.
//!
//! A caller never gets an answer read before it asked: it joins the next read, which starts when
//! the one in flight has ended, so everyone who asked meanwhile shares it. A thousand
//! `reconcile.user` jobs running together make a handful of association reads instead of a
//! thousand, and a thousand onboardings reading their association back make a handful of
//! `sacctmgr show user … withassoc` calls.
//!
//! Reads are kept apart by a key (the accounts read, for example); what the callers of one key
//! ask for is gathered into one request (`Q`, e.g. the users to read) that the read gets when its
//! turn comes. One read of a key is in flight at a time; reads of different keys run side by
//! side (a user reconcile's read of every account does not wait for a preflight's of two).

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::{Shared, SlurmError};

/// A read's answer (or its error) and the effects it recorded, which every caller records.
type Answer<A> = Option<(Result<A, Shared>, Vec<serde_json::Value>)>;

struct Next<Q, A> {
    asked: Q,
    done: watch::Receiver<Answer<A>>,
}

type Pending<K, Q, A> = Arc<Mutex<HashMap<K, Next<Q, A>>>>;

pub struct Coalesced<K, Q, A> {
    /// Names the read in the error of a caller whose read was abandoned.
    what: &'static str,
    /// Reads asked for and not started yet, by key.
    next: Pending<K, Q, A>,
    /// Per key, held by its read in flight. Keys are few (account sets, or one for users).
    turns: Mutex<HashMap<K, Turn>>,
}

type Turn = Arc<tokio::sync::Mutex<()>>;

impl<K, Q, A> Coalesced<K, Q, A>
where
    K: Eq + Hash + Clone + Send + 'static,
    Q: Default + Send + 'static,
    A: Clone + Send + Sync + 'static,
{
    pub fn new(what: &'static str) -> Self {
        Self { what, next: Arc::default(), turns: Mutex::default() }
    }

    fn turn(&self, key: &K) -> Turn {
        self.turns.lock().expect("coalesced turns").entry(key.clone()).or_default().clone()
    }

    /// Joins the next read of `key`, adding to its request with `ask`, and waits for its answer.
    /// If no read of `key` is waiting, this caller starts one, which runs `read` on everything
    /// asked by the time its turn comes. The read runs in its own task: a caller that gives up
    /// does not abandon the others.
    pub async fn read<F, Fut>(&self, key: K, ask: impl FnOnce(&mut Q), read: F) -> Result<A, SlurmError>
    where
        F: FnOnce(Q) -> Fut + Send + 'static,
        Fut: Future<Output = Result<A, SlurmError>> + Send + 'static,
    {
        let mut rx = {
            let mut next = self.next.lock().expect("coalesced reads");
            // a waiting read whose task is gone (it panicked) is replaced, never joined
            match next.get_mut(&key).filter(|n| n.done.has_changed().is_ok()) {
                Some(n) => {
                    ask(&mut n.asked);
                    n.done.clone()
                }
                None => {
                    let (tx, rx) = watch::channel(None);
                    let mut asked = Q::default();
                    ask(&mut asked);
                    next.insert(key.clone(), Next { asked, done: rx.clone() });
                    let turn = self.turn(&key);
                    let pending = self.next.clone();
                    tokio::spawn(async move {
                        let _turn = turn.lock().await;
                        let asked = pending.lock().expect("coalesced reads").remove(&key).map(|n| n.asked);
                        let (r, effects) = crate::effects::collect(read(asked.unwrap_or_default())).await;
                        tx.send_replace(Some((r.map_err(|e| e.shared()), effects)));
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
            None => Err(Shared::abandoned(self.what).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn callers_who_ask_while_a_read_waits_share_it_and_each_gets_the_whole_answer() {
        let reads = Arc::new(Coalesced::<(), Vec<u32>, Arc<Vec<u32>>>::new("test read"));
        let calls = Arc::new(AtomicUsize::new(0));
        // hold the turn so that every caller joins the one waiting read
        let held = reads.turn(&()).lock_owned().await;
        let callers: Vec<_> = (0..5u32)
            .map(|i| {
                let (reads, calls) = (reads.clone(), calls.clone());
                tokio::spawn(async move {
                    reads
                        .read(
                            (),
                            |q| q.push(i),
                            move |q| async move {
                                calls.fetch_add(1, Ordering::SeqCst);
                                Ok(Arc::new(q))
                            },
                        )
                        .await
                })
            })
            .collect();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while reads.next.lock().unwrap().get(&()).map_or(0, |n| n.asked.len()) < 5 {
            assert!(tokio::time::Instant::now() < deadline, "the callers never joined");
            tokio::task::yield_now().await;
        }
        drop(held);
        for c in callers {
            let mut got = (*c.await.unwrap().unwrap()).clone();
            got.sort_unstable();
            assert_eq!(got, vec![0, 1, 2, 3, 4]);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn different_keys_are_read_apart_and_a_failed_read_fails_each_caller() {
        let reads = Coalesced::<u8, (), u8>::new("test read");
        // a read of key 1 in flight does not hold up key 2's
        let _in_flight = reads.turn(&1).lock_owned().await;
        let a = tokio::time::timeout(std::time::Duration::from_secs(5), reads.read(2, |_| {}, |_| async { Ok(1) }))
            .await
            .expect("key 2 read while key 1's turn was held")
            .unwrap();
        let b = reads
            .read(
                3,
                |_| {},
                |_| async { Err(SlurmError::Batch { retryable: true, retry_after: None, detail: "down".into() }) },
            )
            .await;
        assert_eq!(a, 1);
        let err = b.unwrap_err();
        assert!(err.is_retryable() && err.to_string().contains("down"), "{err}");
    }
}
