//! A job queue served by one thread, with completion fences.
//!
//! Both transports talk to "the DSP" through one of these: the emulated transport's thread *is*
//! the DSP (it owns the kernels-dsp context; worker 0 of the pool is this thread), the FastRPC
//! transport's thread makes the blocking `remote_handle64_invoke` calls. Jobs run strictly in
//! submission order, so a buffer registration is always visible to the batches after it. A
//! submitter gets a [`Fence`] back immediately and may do CPU work before waiting on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::{Error, Result, TransportFault};

/// Set once a submitted job has finished running, or is known never to run; it never goes back.
/// The device ties the leases of a batch (the memory it may touch, the crate's leases) to it,
/// so it must not be set while the DSP may still access the batch's memory. It also records
/// *when* it was set, which the swap runtime uses to tell DSP idle time from overlapped staging.
#[derive(Debug, Clone, Default)]
pub struct Completion(Arc<CompletionState>);

#[derive(Debug, Default)]
struct CompletionState {
    done: AtomicBool,
    at: OnceLock<Instant>,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Completion {
    /// True once the job is over.
    pub fn is_done(&self) -> bool {
        self.0.done.load(Ordering::Acquire)
    }

    /// When the job was over (`None` while it is not).
    pub fn done_at(&self) -> Option<Instant> {
        if self.is_done() {
            self.0.at.get().copied()
        } else {
            None
        }
    }

    /// Block until the job is over.
    pub fn wait(&self) {
        let mut g = self.0.lock.lock().expect("completion lock");
        while !self.is_done() {
            g = self.0.cv.wait(g).expect("completion lock");
        }
    }

    pub(crate) fn set(&self) {
        // The time first, so that `is_done` implies `done_at`.
        let _ = self.0.at.set(Instant::now());
        let g = self.0.lock.lock().expect("completion lock");
        self.0.done.store(true, Ordering::Release);
        drop(g);
        self.0.cv.notify_all();
    }
}

struct Slot<R> {
    value: Mutex<Option<Result<R>>>,
    cv: Condvar,
    done: Completion,
}

/// Completion of one submitted job.
pub struct Fence<R = Vec<u32>> {
    slot: Arc<Slot<R>>,
}

impl<R> std::fmt::Debug for Fence<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fence(signaled: {})", self.is_signaled())
    }
}

impl<R> Fence<R> {
    /// True once the job has finished (successfully or not).
    pub fn is_signaled(&self) -> bool {
        self.slot.done.is_done()
    }

    /// The job's completion flag (stays set after [`Self::wait`] took the result).
    pub fn completion(&self) -> Completion {
        self.slot.done.clone()
    }

    /// Block until the job has finished and return its result.
    pub fn wait(self) -> Result<R> {
        let mut v = self.slot.value.lock().expect("fence lock");
        loop {
            if let Some(r) = v.take() {
                return r;
            }
            v = self.slot.cv.wait(v).expect("fence lock");
        }
    }
}

/// Signals the fence exactly once; if a job is dropped unrun (the thread is gone), the fence is
/// signalled with an error instead of leaving the waiter blocked forever.
struct Completer<R> {
    slot: Option<Arc<Slot<R>>>,
}

impl<R> Completer<R> {
    fn complete(mut self, r: Result<R>) {
        if let Some(slot) = self.slot.take() {
            let mut v = slot.value.lock().expect("fence lock");
            *v = Some(r);
            slot.done.set();
            drop(v);
            slot.cv.notify_all();
        }
    }
}

impl<R> Drop for Completer<R> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let mut v = slot.value.lock().expect("fence lock");
            *v = Some(Err(Error::Transport(TransportFault::QueueStopped)));
            slot.done.set();
            drop(v);
            slot.cv.notify_all();
        }
    }
}

type Job<S> = Box<dyn FnOnce(&mut S) + Send>;

#[derive(Default)]
struct Gate {
    paused: Mutex<bool>,
    cv: Condvar,
}

/// One serving thread that owns state `S` and runs submitted jobs on it in order.
pub(crate) struct JobQueue<S> {
    tx: Mutex<Option<mpsc::Sender<Job<S>>>>,
    gate: Arc<Gate>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<S: 'static> JobQueue<S> {
    /// Start the thread; `init` builds the state on it (so thread-affine resources are created
    /// where they are used). Fails with `init`'s error.
    pub(crate) fn start(
        name: &str,
        init: impl FnOnce() -> Result<S> + Send + 'static,
    ) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Job<S>>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let gate = Arc::new(Gate::default());
        let g = gate.clone();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut state = match init() {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Ok(job) = rx.recv() {
                    {
                        let mut p = g.paused.lock().expect("gate lock");
                        while *p {
                            p = g.cv.wait(p).expect("gate lock");
                        }
                    }
                    job(&mut state);
                }
            })
            .map_err(|e| Error::Os {
                call: "spawn DSP queue thread",
                source: e,
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(JobQueue {
                tx: Mutex::new(Some(tx)),
                gate,
                thread: Mutex::new(Some(thread)),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(Error::Transport(TransportFault::QueueDiedAtStart))
            }
        }
    }

    /// Queue `f`; returns at once with a fence for its result.
    pub(crate) fn submit<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut S) -> Result<R> + Send + 'static,
    ) -> Result<Fence<R>> {
        self.submit_with(Completion::default(), f)
    }

    /// [`Self::submit`] signalling `done` when the job is over (run, failed or dropped unrun).
    pub(crate) fn submit_with<R: Send + 'static>(
        &self,
        done: Completion,
        f: impl FnOnce(&mut S) -> Result<R> + Send + 'static,
    ) -> Result<Fence<R>> {
        let slot = Arc::new(Slot {
            value: Mutex::new(None),
            cv: Condvar::new(),
            done,
        });
        let completer = Completer {
            slot: Some(slot.clone()),
        };
        let job: Job<S> = Box::new(move |s: &mut S| completer.complete(f(s)));
        let tx = self.tx.lock().expect("queue lock");
        let tx = tx
            .as_ref()
            .ok_or(Error::Transport(TransportFault::QueueShutDown))?;
        tx.send(job)
            .map_err(|_| Error::Transport(TransportFault::QueueThreadGone))?;
        Ok(Fence { slot })
    }

    /// Queue `f` and wait for it.
    pub(crate) fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut S) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        self.submit(f)?.wait()
    }

    /// Hold jobs in the queue (the running one finishes) until [`Self::resume`].
    pub(crate) fn pause(&self) {
        *self.gate.paused.lock().expect("gate lock") = true;
    }

    /// Let queued jobs run again.
    pub(crate) fn resume(&self) {
        *self.gate.paused.lock().expect("gate lock") = false;
        self.gate.cv.notify_all();
    }
}

impl<S> Drop for JobQueue<S> {
    fn drop(&mut self) {
        // Never leave the thread parked on the gate.
        *self.gate.paused.lock().expect("gate lock") = false;
        self.gate.cv.notify_all();
        drop(self.tx.lock().expect("queue lock").take());
        if let Some(t) = self.thread.lock().expect("queue lock").take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_in_order_and_fences_signal() {
        let q = JobQueue::start("test-queue", || Ok(Vec::<u32>::new())).unwrap();
        q.pause();
        let f1 = q
            .submit(|s: &mut Vec<u32>| {
                s.push(1);
                Ok(s.len())
            })
            .unwrap();
        let f2 = q
            .submit(|s: &mut Vec<u32>| {
                s.push(2);
                Ok(s.clone())
            })
            .unwrap();
        // Paused: submission returned, nothing ran.
        assert!(!f1.is_signaled() && !f2.is_signaled());
        q.resume();
        assert_eq!(f1.wait().unwrap(), 1);
        assert_eq!(f2.wait().unwrap(), vec![1, 2]);
        let e = q
            .call(|_: &mut Vec<u32>| -> Result<()> {
                Err(Error::Transport(TransportFault::RpcmemAlloc { bytes: 77 }))
            })
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::Transport(TransportFault::RpcmemAlloc { bytes: 77 })
            ),
            "{e}"
        );
    }

    #[test]
    fn init_failure_is_returned() {
        let r = JobQueue::<()>::start("bad", || {
            Err(Error::Transport(TransportFault::ContextAlloc { bytes: 5 }))
        });
        let e = r.err().unwrap().to_string();
        assert!(e.contains("cannot allocate 5 bytes"), "{e}");
    }

    #[test]
    fn dropping_the_queue_signals_pending_fences() {
        let q = JobQueue::start("drop-queue", || Ok(())).unwrap();
        q.pause();
        let f = q.submit(|_: &mut ()| Ok(1)).unwrap();
        drop(q); // resumes, runs the job, joins
        assert_eq!(f.wait().unwrap(), 1);
    }
}
