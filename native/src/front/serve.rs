//! A front's life: its runtime on a thread of its own, the accept loop (plaintext or TLS),
//! and the graceful stop (stop accepting, let calls in flight finish for a grace period,
//! then close).

use std::future::Future;
use std::io;
use std::net::TcpListener as StdListener;
use std::os::unix::io::{FromRawFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::tls::HANDSHAKE_TIMEOUT;

/// A front's runtime: one thread (it never holds the GIL). Tasks woken from other threads
/// (a lookup whose keys Python loaded, an answer or the replies Python sends back) are
/// taken before the tasks the front's own connections woke: tokio's default takes one
/// of them every 31 polls, so under load a burst of a few hundred answers from Python
/// waited seconds behind the connections' work.
pub(crate) fn runtime() -> io::Result<Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .global_queue_interval(1)
        .build()
}

/// The listening socket Python hands over (bound, listening, given up by
/// `socket.detach()`), owned by the front from now on.
pub(crate) fn listener(listen_fd: RawFd) -> io::Result<StdListener> {
    // SAFETY: the caller passes a listening socket it has given up (socket.detach()).
    let listener = unsafe { StdListener::from_raw_fd(listen_fd) };
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// None while serving; the grace period for calls in flight once stopping.
pub(crate) type Closing = watch::Receiver<Option<Duration>>;

/// A front's thread, serving until `stop` (or until dropped, with no grace).
pub(crate) struct Serving {
    closing: watch::Sender<Option<Duration>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Serving {
    /// Run `serve` (given the closing signal) on `runtime`, on a thread named `name`.
    pub(crate) fn start<F>(
        name: &str,
        runtime: Runtime,
        serve: impl FnOnce(Closing) -> F,
    ) -> io::Result<Self>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (closing, closed) = watch::channel(None);
        let serving = serve(closed);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || runtime.block_on(serving))?;
        Ok(Serving {
            closing,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stop accepting, let calls in flight finish for up to `grace` seconds, then close;
    /// returns once the thread has ended (without the GIL meanwhile).
    pub(crate) fn stop(&self, py: Python<'_>, grace: f64) {
        let _ = self.closing.send(Some(crate::time::seconds(grace)));
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            py.allow_threads(move || {
                let _ = thread.join();
            });
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.closing.send(Some(Duration::ZERO));
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// An accepted connection: plaintext, or TLS once its handshake is done.
pub(crate) enum Socket {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Socket::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Socket::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Socket::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Socket::Plain(s) => s.is_write_vectored(),
            Socket::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Plain(s) => Pin::new(s).poll_flush(cx),
            Socket::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Socket::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Accept connections on `listener` until closing, each served by `connection` on a task
/// of its own (with `tls`, once its handshake is done: one that fails or takes longer than
/// `HANDSHAKE_TIMEOUT` ends there); then let them finish for the grace period.
pub(crate) async fn accept<C, F>(
    listener: StdListener,
    mut closed: Closing,
    tls: Option<TlsAcceptor>,
    connection: C,
) where
    C: Fn(Socket, Closing) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let connection = Arc::new(connection);
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(_) => return,
    };
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((socket, _)) = accepted {
                    let _ = socket.set_nodelay(true);
                    match tls.clone() {
                        None => {
                            connections.spawn(connection(Socket::Plain(socket), closed.clone()));
                        }
                        Some(acceptor) => {
                            let (connection, closed) = (Arc::clone(&connection), closed.clone());
                            connections.spawn(async move {
                                // a handshake that fails (plaintext, an unknown CA) ends here
                                let handshake = tokio::time::timeout(
                                    HANDSHAKE_TIMEOUT,
                                    acceptor.accept(socket),
                                );
                                if let Ok(Ok(stream)) = handshake.await {
                                    connection(Socket::Tls(Box::new(stream)), closed).await;
                                }
                            });
                        }
                    }
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = closed.changed() => break,
        }
    }
    drop(listener);
    // connections finish their calls; those that take longer are cut
    let grace = closed.borrow().unwrap_or(Duration::ZERO);
    let _ = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    /// A task always ready to run, as a front's connections are under load: it counts its
    /// polls and wakes itself.
    struct Busy(Arc<AtomicUsize>);

    impl Future for Busy {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[test]
    fn a_front_runs_tasks_woken_elsewhere_before_its_own() {
        const WOKEN: usize = 200;
        let runtime = super::runtime().unwrap();
        let polls = Arc::new(AtomicUsize::new(0));
        let seen = runtime.block_on(async {
            for _ in 0..8 {
                tokio::spawn(Busy(Arc::clone(&polls)));
            }
            // tasks waiting for another thread, as lookups wait for Python's loads
            let mut senders = Vec::new();
            let mut woken = Vec::new();
            for _ in 0..WOKEN {
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                senders.push(tx);
                let polls = Arc::clone(&polls);
                woken.push(tokio::spawn(async move {
                    let _ = rx.await;
                    polls.load(Ordering::SeqCst)
                }));
            }
            // every task has run once, and waits
            tokio::task::yield_now().await;
            // all woken at once from another thread, while this one waits for it
            std::thread::spawn(move || {
                for tx in senders {
                    let _ = tx.send(());
                }
            })
            .join()
            .unwrap();
            let before = polls.load(Ordering::SeqCst);
            let mut latest = before;
            for task in woken {
                latest = latest.max(task.await.unwrap());
            }
            latest - before
        });
        // the busy tasks' polls before the last woken task ran: tokio's default takes one
        // such task every 31 polls (1,413 here with it)
        assert!(
            seen < WOKEN,
            "{seen} polls of the front's own tasks came first"
        );
    }
}
