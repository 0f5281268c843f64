//! Client sessions and their end. The SDK opens a session per `ServiceClient` and heartbeats it
//! every 10 s (tinker 0.38 `_session_heartbeat`); it never calls `finish`. A session ends when
//! finished or when no heartbeat came for `--session-timeout-s`; then its training models, its
//! sampling sessions and the sampler weights only they used are dropped (each model's thread
//! exits and frees it). A heartbeat for an ended session gets HTTP 410, which the SDK takes as
//! "finished" and stops heartbeating; a call naming one of its models is refused saying why.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many ended sessions are remembered (to say why their ids no longer work).
const REMEMBER_ENDED: usize = 4096;

pub struct Sessions {
    inner: Mutex<Inner>,
    /// A session without a heartbeat for this long ends.
    pub timeout: Duration,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// Live sessions and their last sign of life.
    alive: HashMap<String, Instant>,
    /// Ended sessions and why, oldest first (bounded).
    ended: VecDeque<(String, String)>,
}

impl Sessions {
    pub fn new(timeout: Duration) -> Sessions {
        Sessions {
            inner: Mutex::new(Inner::default()),
            timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new live session's id: unique across server restarts, so checkpoints of an earlier run
    /// are never overwritten.
    pub fn open(&self) -> String {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut s = self.lock();
        let id = format!("sess-{stamp}-{}", s.next);
        s.next += 1;
        s.alive.insert(id.clone(), Instant::now());
        id
    }

    /// A sign of life from session `id`. An unknown id is taken as live (a client of an earlier
    /// run of this server goes on after a restart); an ended one is refused with why it ended.
    pub fn touch(&self, id: &str) -> Result<(), String> {
        let mut s = self.lock();
        if let Some(why) = s
            .ended
            .iter()
            .find(|(e, _)| e == id)
            .map(|(_, w)| w.clone())
        {
            return Err(format!("session {id:?} has ended ({why})"));
        }
        s.alive.insert(id.to_string(), Instant::now());
        Ok(())
    }

    /// Why session `id` ended, if it did.
    pub fn ended(&self, id: &str) -> Option<String> {
        let s = self.lock();
        s.ended
            .iter()
            .find(|(e, _)| e == id)
            .map(|(_, w)| w.clone())
    }

    /// Marks `id` ended (whether or not it was known); false if it had ended already.
    pub fn end(&self, id: &str, why: &str) -> bool {
        let mut s = self.lock();
        if s.ended.iter().any(|(e, _)| e == id) {
            return false;
        }
        s.alive.remove(id);
        s.ended.push_back((id.to_string(), why.to_string()));
        while s.ended.len() > REMEMBER_ENDED {
            s.ended.pop_front();
        }
        true
    }

    /// The live sessions without a sign of life for longer than the timeout.
    pub fn expired(&self) -> Vec<String> {
        let s = self.lock();
        s.alive
            .iter()
            .filter(|(_, t)| t.elapsed() > self.timeout)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// The session a model id (`{session}:train:{seq}`) or sampling session id
/// (`{session}:sample:{k}`) belongs to.
pub fn session_of(id: &str) -> &str {
    id.split(":train:")
        .next()
        .and_then(|s| s.split(":sample:").next())
        .unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_end_once_and_say_why() {
        let s = Sessions::new(Duration::from_millis(50));
        let a = s.open();
        let b = s.open();
        assert_ne!(a, b);
        assert!(s.expired().is_empty());
        std::thread::sleep(Duration::from_millis(80));
        s.touch(&b).unwrap();
        assert_eq!(s.expired(), vec![a.clone()]);
        assert!(s.end(&a, "no heartbeat for 0 s"));
        assert!(!s.end(&a, "again"));
        assert!(s.expired().is_empty());
        let e = s.touch(&a).unwrap_err();
        assert!(e.contains("has ended (no heartbeat"), "{e}");
        assert_eq!(s.ended(&b), None);
        // A session of an earlier server run is adopted.
        s.touch("sess-1-0").unwrap();
        assert_eq!(session_of("sess-1-0:train:3"), "sess-1-0");
        assert_eq!(session_of("sess-1-0:sample:0"), "sess-1-0");
    }
}
