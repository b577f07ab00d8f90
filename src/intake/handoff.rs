//! The hand-over from a process's delivery writer to its pump (`pump`): the ids just stored.

use tokio::sync::Notify;
use uuid::Uuid;

/// What a process's writer hands its pump: the ids of the deliveries it just stored, and a
/// wake-up. Losing them (a crash) loses nothing: the deliveries are in PostgreSQL, pending, and
/// a pump's scan finds them.
#[derive(Debug, Default)]
pub struct Handoff {
    ids: std::sync::Mutex<Vec<Uuid>>,
    wake: Notify,
}

impl Handoff {
    /// Hands over stored deliveries and wakes the pump (not for none).
    pub fn hand(&self, ids: Vec<Uuid>) {
        if ids.is_empty() {
            return;
        }
        self.ids.lock().expect("handoff").extend(ids);
        self.wake.notify_one();
    }

    /// Puts back ids taken and not processed: they go first.
    pub(super) fn hand_back(&self, ids: Vec<Uuid>) {
        if !ids.is_empty() {
            self.ids.lock().expect("handoff").splice(0..0, ids);
        }
    }

    /// Until the next hand-over (or one made since the last wait).
    pub(super) async fn woken(&self) {
        self.wake.notified().await
    }

    /// Up to `n` handed ids, oldest first.
    pub(super) fn take(&self, n: usize) -> Vec<Uuid> {
        let mut ids = self.ids.lock().expect("handoff");
        let n = n.min(ids.len());
        let mut taken: Vec<Uuid> = ids.drain(..n).collect();
        taken.sort_unstable();
        taken
    }

    pub(super) fn len(&self) -> usize {
        self.ids.lock().expect("handoff").len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
