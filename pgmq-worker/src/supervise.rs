//! Supervision: an internal task that panics is restarted (counted in
//! `task_restarts`, shown in [`Health`](crate::Health)), and the test hook
//! that makes one panic on purpose (feature `fault-injection`).

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt;
use tokio::task::JoinHandle;

use crate::health::HealthState;
use crate::stats::{bump, Stats};

/// What supervision reads: the `fault-injection` test hooks (empty
/// without the feature).
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    /// The internal task that panics once, at its start.
    #[cfg(feature = "fault-injection")]
    pub panic_once_in: Option<&'static str>,
    /// A task that panics stays dead, and a handler's caught panic is
    /// raised again in its loop.
    #[cfg(feature = "fault-injection")]
    pub resume_panics: bool,
}

/// Starts internal tasks and restarts those that panic.
#[derive(Clone)]
pub(crate) struct Supervisor {
    stats: Arc<Stats>,
    health: Arc<HealthState>,
    /// Test hook: a task that panics stays dead (the campaign's
    /// panic-uncaught sabotage models a worker without supervision).
    #[cfg(feature = "fault-injection")]
    resume_panics: bool,
}

impl Supervisor {
    pub(crate) fn new(stats: Arc<Stats>, health: Arc<HealthState>, settings: &Settings) -> Self {
        #[cfg(not(feature = "fault-injection"))]
        let _ = settings;
        Supervisor {
            stats,
            health,
            #[cfg(feature = "fault-injection")]
            resume_panics: settings.resume_panics,
        }
    }

    /// Runs the task that `make` builds until it returns; after a panic,
    /// logs it, counts it in `task_restarts`, records it in the health
    /// ([`Health::task_restarts`](crate::Health::task_restarts),
    /// [`Health::last_restart`](crate::Health::last_restart)) and runs a
    /// new one (after a short pause, so that a task that panics at once
    /// does not spin).
    pub(crate) fn spawn<F, Fut>(&self, name: &'static str, make: F) -> JoinHandle<()>
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                match std::panic::AssertUnwindSafe(make()).catch_unwind().await {
                    Ok(()) => return,
                    Err(p) => {
                        #[cfg(feature = "fault-injection")]
                        if this.resume_panics {
                            return;
                        }
                        bump(&this.stats.c.task_restarts, 1);
                        let why = crate::handler::panic_text_of(name, &*p);
                        tracing::error!(task = name, panic = %why, "internal task panicked; restarting it");
                        this.health.restarted(why);
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
        })
    }
}

/// Test hook (feature `fault-injection`): the internal task named in
/// `panic_once_in` panics the first time it calls [`maybe_panic`](Self::maybe_panic);
/// without the feature, nothing.
pub(crate) struct PanicOnce {
    #[cfg(feature = "fault-injection")]
    task: Option<&'static str>,
    #[cfg(feature = "fault-injection")]
    fired: std::sync::atomic::AtomicBool,
}

impl PanicOnce {
    pub(crate) fn new(settings: &Settings) -> Self {
        #[cfg(not(feature = "fault-injection"))]
        let _ = settings;
        PanicOnce {
            #[cfg(feature = "fault-injection")]
            task: settings.panic_once_in,
            #[cfg(feature = "fault-injection")]
            fired: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Panics if `task` is the one named and it has not panicked yet.
    pub(crate) fn maybe_panic(&self, task: &str) {
        #[cfg(feature = "fault-injection")]
        if self.task == Some(task) && !self.fired.swap(true, std::sync::atomic::Ordering::Relaxed) {
            panic!("injected panic in the {task}");
        }
        #[cfg(not(feature = "fault-injection"))]
        let _ = task;
    }
}
