//! How far the history went: what tells a running replica that the database behind it was
//! replaced by an older copy (see `epoch.rs`). Writes and lists record what they handed out;
//! one that finds the database behind that asks the tail to rotate the epoch, and every
//! replica's watchers relist, told why.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::store::fanout::Fanout;

/// A point of the history taken before a database read: [`History::went_back`] compares what
/// the read found with it. Taken before, so that a change committed while the read ran (and
/// observed meanwhile) never looks like one the database lost.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark(u32, u64);

/// The furthest point of the history this process handed out, and a reset noticed outside
/// the tail.
pub(crate) struct History {
    fanout: Arc<Fanout>,
    /// Wakes the tail, which rotates the epoch.
    wake: Arc<Notify>,
    state: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// The furthest point of the history this process has handed out to clients, by any
    /// path (writes acknowledged, lists read, events fanned out): `(epoch, seq)`. A database
    /// behind it in the same epoch is an older copy, even when the tail never saw that far
    /// (it was disconnected while the others went on).
    furthest: Option<(u32, u64)>,
    /// A history reset noticed outside the tail (by a write or a list): rotate this epoch.
    reset_requested: Option<(u32, String)>,
}

impl History {
    pub(crate) fn new(fanout: Arc<Fanout>, wake: Arc<Notify>) -> Arc<Self> {
        Arc::new(Self {
            fanout,
            wake,
            state: Mutex::default(),
        })
    }

    fn state(&self) -> MutexGuard<'_, Seen> {
        // A panic while holding the lock leaves consistent data (every update is one step).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `(epoch, seq)` was handed out to a client (acknowledged or listed).
    pub(crate) fn observe(&self, epoch: u32, seq: u64) {
        match &mut self.state().furthest {
            Some((e, s)) if *e == epoch => *s = (*s).max(seq),
            seen => *seen = Some((epoch, seq)),
        }
    }

    /// The furthest point handed out so far; take it before reading the database's head.
    pub(crate) fn mark(&self) -> Mark {
        // Lock order: history, then fan-out (the fan-out never takes this lock).
        let state = self.state();
        let (epoch, head) = self.fanout.position();
        match state.furthest {
            Some((e, s)) if e == epoch => Mark(e, s.max(head)),
            // Written or listed in an epoch the tail has not switched to yet.
            Some((e, s)) => Mark(e, s),
            None => Mark(epoch, head),
        }
    }

    /// Why the database's `(epoch, seq)`, read after `mark` was taken, shows an older copy
    /// put back: it is behind what this process had handed out by then in that epoch.
    pub(crate) fn behind(mark: Mark, epoch: u32, seq: u64) -> Option<String> {
        let Mark(e, at) = mark;
        (e == epoch && seq < at).then(|| {
            format!(
                "the change history went back from {at} to {seq} in epoch {epoch}: an older \
                 copy of the database was restored"
            )
        })
    }

    /// For a write or a list: whether the database's `(epoch, seq)`, read after `mark`, is
    /// behind it ([`History::behind`]). If so, asks the tail to rotate the epoch (every
    /// watcher relists) and returns why.
    pub(crate) fn went_back(&self, mark: Mark, epoch: u32, seq: u64) -> Option<String> {
        let reason = Self::behind(mark, epoch, seq)?;
        self.state().reset_requested = Some((epoch, reason.clone()));
        self.wake.notify_one();
        Some(reason)
    }

    /// The reset a write or a list asked for, if any (taken: the tail rotates once).
    pub(crate) fn take_reset_request(&self) -> Option<(u32, String)> {
        self.state().reset_requested.take()
    }
}
