//! A thread of its own for the work one database connection serialises (issue 14, SQLite's
//! writer; docs/performance.md "The SQLite writer thread").
//!
//! SQLite has one writer connection per file, and sqlx drives it from a worker thread: each
//! statement, `BEGIN` and `COMMIT` is a hand-off to that thread and back, and every "back"
//! wakes the task holding the connection. On the service's runtime that task waits behind
//! every HTTP task ready at that moment, so under load the connection was held ~5-7 ms per
//! write for well under 1 ms of SQLite work, and each payout's four paydb writes queued for
//! it. A [`WriterThread`] is an OS thread running a current-thread runtime on which nothing
//! but those transactions runs: the caller hands over the whole transaction as one future
//! ([`WriterThread::run`]) and awaits only its answer, and each hand-off inside it wakes a
//! thread that has nothing else to do.
//!
//! What it does not change: the transaction is the same future, with the same statements,
//! checks and conditional writes, run to its end; it only runs elsewhere. A future given to
//! [`WriterThread::run`] runs to its end even if the caller stops waiting (as every request
//! does, dlock-http `envelope`), so a transaction is never abandoned half-way by a caller
//! that went away. A panic in it reaches the caller as the same panic. The caller's trace
//! context and tracing span go with it (`trace::carry`).
//!
//! The thread's runtime has timers and no I/O driver (a future that needs a socket cannot
//! run on it; SQLite's calls go to its connection's worker thread): it parks on a futex,
//! so each answer of that worker wakes it with one futex wake instead of an eventfd write
//! and an epoll return.
//!
//! Bounds: one thread per [`WriterThread::start`] (the SQLite stores share one per process,
//! `dlock_db::sqlite_writer_thread`);
//! its queue is the callers awaiting it, at most one per request in flight, which
//! `http.requests-in-flight-max` bounds. The thread ends when the last clone is dropped.
//!
//! Under `cfg(madsim)` there are no SQLite stores (sqlx cannot run in the simulation), and a
//! [`WriterThread`] runs the future in line on the caller's task: no thread is started.

use std::future::Future;
use std::sync::Arc;

/// A dedicated thread for one connection's transactions; cheap to clone (clones share the
/// thread).
#[derive(Debug, Clone)]
pub struct WriterThread {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    #[cfg(not(madsim))]
    name: String,
    #[cfg(not(madsim))]
    handle: tokio::runtime::Handle,
    /// The thread's id ([`WriterThread::is_current`]).
    #[cfg(not(madsim))]
    thread: std::thread::ThreadId,
    /// Dropped with the last clone: the thread's runtime then stops.
    #[cfg(not(madsim))]
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl WriterThread {
    /// Starts the thread `name` (shown by `top -H` and in panics) with its runtime.
    pub fn start(name: &str) -> Result<WriterThread, String> {
        #[cfg(not(madsim))]
        {
            // Timers only: see the module doc (docs/performance.md "The SQLite writer thread").
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .map_err(|e| format!("writer thread {name}: {e}"))?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let joined = std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(move || {
                    // Returns when the last clone drops the sender; the runtime's drop then
                    // cancels what is left (nothing: every caller holds a clone while it waits).
                    let _ = runtime.block_on(stopped);
                })
                .map_err(|e| format!("writer thread {name}: {e}"))?;
            let thread = joined.thread().id();
            Ok(WriterThread { inner: Arc::new(Inner { name: name.to_owned(), handle, thread, _stop: stop }) })
        }
        #[cfg(madsim)]
        {
            let _ = name;
            Ok(WriterThread { inner: Arc::new(Inner {}) })
        }
    }

    /// Whether `self` and `other` are the same thread (clones of one [`WriterThread::start`]).
    pub fn is_same(&self, other: &WriterThread) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether the caller is running on this thread (inside [`WriterThread::run`]). Under
    /// `cfg(madsim)`, where `run` is in line, always true.
    pub fn is_current(&self) -> bool {
        #[cfg(not(madsim))]
        return std::thread::current().id() == self.inner.thread;
        #[cfg(madsim)]
        true
    }

    /// Runs `work` to its end on the thread and answers its output. `work` keeps running if
    /// the caller stops waiting; a panic in it is resumed in the caller.
    pub async fn run<F>(&self, work: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        #[cfg(not(madsim))]
        {
            // The caller's trace context and tracing span go with it (its logs keep the
            // request's `traceId`).
            match self.inner.handle.spawn(crate::trace::carry(work)).await {
                Ok(output) => output,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // Only a runtime that shut down cancels its tasks, and this one outlives every
                // caller holding `self`.
                Err(e) => panic!("writer thread {} lost a transaction: {e}", self.inner.name),
            }
        }
        #[cfg(madsim)]
        work.await
    }
}

/// Runs `work` on `writer` when there is one ([`WriterThread::run`]), else in line: how a
/// service runs one of its store's writes (the store names its thread, or `None`).
pub async fn run_on<F>(writer: Option<WriterThread>, work: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match writer {
        Some(writer) => writer.run(work).await,
        None => work.await,
    }
}

/// Whether a store write is running off the store's writer thread: true only when the store
/// names one (`writer`) and the caller is not on it. A service's write helper ([`run_on`])
/// never is; a call site that skips the helper is
/// (docs/performance.md "The SQLite writer thread").
pub fn runs_off(writer: Option<&WriterThread>) -> bool {
    writer.is_some_and(|w| !w.is_current())
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;

    /// The work runs on the named thread, not the caller's, and its answer comes back.
    #[tokio::test]
    async fn work_runs_on_the_writer_thread_and_its_answer_comes_back() {
        let writer = WriterThread::start("dlock-test-writer").expect("start");
        let caller = std::thread::current().id();
        let (thread, name) =
            writer.run(async { (std::thread::current().id(), std::thread::current().name().map(str::to_owned)) }).await;
        assert_ne!(thread, caller);
        assert_eq!(name.as_deref(), Some("dlock-test-writer"));
        assert_eq!(writer.clone().run(async { 6 * 7 }).await, 42, "a clone runs on the same thread");
        assert!(writer.is_same(&writer.clone()));
        assert!(!writer.is_same(&WriterThread::start("dlock-test-writer").expect("start")), "another start");
    }

    /// Only work inside `run` is on the thread: the check a service's store-write counter makes.
    #[tokio::test]
    async fn only_work_inside_run_is_on_the_writer_thread() {
        let writer = WriterThread::start("dlock-test-writer").expect("start");
        assert!(!writer.is_current(), "the caller is not the writer thread");
        assert!(runs_off(Some(&writer)));
        let w = writer.clone();
        assert!(writer.run(async move { w.is_current() && !runs_off(Some(&w)) }).await);
        let other = WriterThread::start("dlock-test-writer").expect("start");
        let w = writer.clone();
        assert!(!other.run(async move { w.is_current() }).await, "another writer thread is not this one");
        assert!(!runs_off(None), "a store without a writer thread writes anywhere");
    }

    /// A caller that stops waiting does not stop the work: it runs to its end.
    #[tokio::test]
    async fn work_whose_caller_stops_waiting_still_runs_to_its_end() {
        let writer = WriterThread::start("dlock-test-writer").expect("start");
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let (started, has_started) = tokio::sync::oneshot::channel::<()>();
        let w = writer.clone();
        let caller = tokio::spawn(async move {
            w.run(async move {
                let _ = started.send(());
                let _ = wait.await;
                let _ = tx.send(7);
            })
            .await
        });
        has_started.await.expect("the work started");
        caller.abort();
        let _ = caller.await;
        let _ = go.send(());
        assert_eq!(rx.await.ok(), Some(7), "the work finished after its caller went away");
    }

    /// A panic in the work reaches the caller.
    #[tokio::test]
    async fn a_panic_in_the_work_reaches_the_caller() {
        let writer = WriterThread::start("dlock-test-writer").expect("start");
        let w = writer.clone();
        let joined = tokio::spawn(async move { w.run(async { panic!("boom in the writer") }).await }).await;
        let Err(e) = joined else { panic!("the caller did not panic") };
        let payload = e.into_panic();
        assert_eq!(payload.downcast_ref::<&str>().copied(), Some("boom in the writer"));
        assert_eq!(writer.run(async { 1 }).await, 1, "the thread survives a panicked transaction");
    }
}
