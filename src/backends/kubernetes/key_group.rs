//! Group commit for the writes to one key Secret in one process: an edit joins the Secret's
//! pending edits and waits for its turn; whoever takes the turn writes every pending edit in one
//! call and answers each. An edit taken by a writer that was stopped before it answered (its step
//! cancelled) is put back and written by its own caller.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot::{self, error::TryRecvError};

use super::K8sError;
use super::keys::{Applied, Edit};

type Answer = oneshot::Sender<Result<Applied, K8sError>>;

/// The pending edits of one Secret and the turn to write them.
#[derive(Default)]
pub(super) struct Group {
    pending: Mutex<Vec<(Edit, Answer)>>,
    turn: tokio::sync::Mutex<()>,
}

impl Group {
    /// Has `edit` written, by this caller or by another in the same call; `write` writes a group of
    /// edits and says which of them changed the Secret.
    pub(super) async fn edit<F, Fut>(&self, edit: Edit, write: F) -> Result<Applied, K8sError>
    where
        F: Fn(Vec<Edit>) -> Fut,
        Fut: Future<Output = Result<Vec<bool>, K8sError>>,
    {
        let mut answer = self.join(edit.clone());
        loop {
            let _turn = self.turn.lock().await;
            match answer.try_recv() {
                Ok(r) => return r,
                // taken by a writer that stopped before answering: ours is not pending any more
                Err(TryRecvError::Closed) => answer = self.join(edit.clone()),
                Err(TryRecvError::Empty) => {}
            }
            let group = std::mem::take(&mut *self.pending.lock().expect("pending key edits"));
            let (edits, answers): (Vec<Edit>, Vec<Answer>) = group.into_iter().unzip();
            match write(edits).await {
                Ok(changed) => {
                    for (a, c) in answers.into_iter().zip(changed) {
                        let _ = a.send(Ok(if c { Applied::Changed } else { Applied::Unchanged }));
                    }
                }
                Err(e) => {
                    for a in answers {
                        let _ = a.send(Err(e.duplicate()));
                    }
                }
            }
        }
    }

    fn join(&self, edit: Edit) -> oneshot::Receiver<Result<Applied, K8sError>> {
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending key edits").push((edit, tx));
        rx
    }
}

/// The groups of this process, one per Secret (`namespace/name`).
#[derive(Clone, Default)]
pub struct Writers(Arc<Mutex<HashMap<String, Arc<Group>>>>);

impl Writers {
    pub(super) fn of(&self, secret: &str) -> Arc<Group> {
        self.0.lock().expect("key writers").entry(secret.to_string()).or_default().clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::Duration;

    use super::*;
    use crate::domain::names::Username;

    fn remove(user: &str) -> Edit {
        Edit::Remove(Username::parse(user).unwrap())
    }

    /// A writer that takes a while and records the size of each group it is given.
    struct Slow {
        calls: Mutex<Vec<usize>>,
        started: AtomicUsize,
    }

    impl Slow {
        async fn write(&self, edits: Vec<Edit>) -> Result<Vec<bool>, K8sError> {
            self.started.fetch_add(1, SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.calls.lock().unwrap().push(edits.len());
            // every second user "had" an entry
            Ok(edits.iter().map(|e| matches!(e, Edit::Remove(u) if u.as_str().ends_with('0'))).collect())
        }
    }

    #[tokio::test]
    async fn edits_that_arrive_during_a_write_are_written_together() {
        let (group, slow) = (Arc::new(Group::default()), Arc::new(Slow { calls: Mutex::default(), started: 0.into() }));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..40 {
            let (group, slow) = (group.clone(), slow.clone());
            tasks.spawn(async move {
                let user = format!("u{i}");
                (user.clone(), group.edit(remove(&user), |e| slow.write(e)).await.unwrap())
            });
        }
        let mut answers = vec![];
        while let Some(r) = tasks.join_next().await {
            answers.push(r.unwrap());
        }
        assert_eq!(answers.len(), 40);
        for (user, applied) in answers {
            let want = if user.ends_with('0') { Applied::Changed } else { Applied::Unchanged };
            assert_eq!(applied, want, "{user}");
        }
        let calls = slow.calls.lock().unwrap().clone();
        assert_eq!(calls.iter().sum::<usize>(), 40, "every edit written once: {calls:?}");
        assert!(calls.len() <= 3, "40 concurrent edits took {} writes: {calls:?}", calls.len());
    }

    #[tokio::test]
    async fn an_edit_taken_by_a_stopped_writer_is_written_by_its_caller() {
        let (group, slow) = (Arc::new(Group::default()), Arc::new(Slow { calls: Mutex::default(), started: 0.into() }));
        // the first caller writes alone; the second joins while it writes
        let first = {
            let (group, slow) = (group.clone(), slow.clone());
            tokio::spawn(async move { group.edit(remove("a0"), |e| slow.write(e)).await })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while slow.started.load(SeqCst) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "the first write never started");
            tokio::task::yield_now().await;
        }
        // the second and third join while it writes; the second takes the next turn with both
        let second = {
            let (group, slow) = (group.clone(), slow.clone());
            tokio::spawn(async move { group.edit(remove("b0"), |e| slow.write(e)).await })
        };
        while group.pending.lock().unwrap().is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "the second edit never joined");
            tokio::task::yield_now().await;
        }
        let third = {
            let (group, slow) = (group.clone(), slow.clone());
            tokio::spawn(async move { group.edit(remove("c0"), |e| slow.write(e)).await })
        };
        while group.pending.lock().unwrap().len() < 2 {
            assert!(tokio::time::Instant::now() < deadline, "the third edit never joined");
            tokio::task::yield_now().await;
        }
        // stop the second while it writes both
        while slow.started.load(SeqCst) < 2 {
            assert!(tokio::time::Instant::now() < deadline, "the second write never started");
            tokio::task::yield_now().await;
        }
        second.abort();
        assert_eq!(first.await.unwrap().unwrap(), Applied::Changed);
        assert!(second.await.unwrap_err().is_cancelled());
        assert_eq!(third.await.unwrap().unwrap(), Applied::Changed);
        let calls = slow.calls.lock().unwrap().clone();
        assert_eq!(calls, vec![1, 1], "the stopped write never finished; the third was written alone");
    }
}
