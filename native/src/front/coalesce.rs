//! The gRPC front's writes gathered into one system call per answer, or fewer.
//!
//! h2 writes a unary answer as three frames (HEADERS, DATA, trailers) and flushes its
//! buffer before taking a frame after a DATA frame it chains rather than copies (one of
//! 256 bytes or more), and answers each PING (a Go client's bandwidth probe follows every
//! answer) as soon as it reads it: three `writev`s per call under
//! `benchmarks/l1_misses.py`'s gRPC hits (`strace -c`), each a TCP segment the client's
//! kernel receives and wakes the client for. `Coalesce` holds what h2 writes, and a flush
//! writes it only once a poll of the connection's task (a turn, counted by `Turns`) has
//! added nothing more, or what is held has waited a whole turn: the PING's answer and the
//! call's frames (and other streams' answers on the connection) go in one write, at the
//! cost of one more poll of the task, which a held flush asks for (it wakes the task).
//! Past `MAX_HELD` bytes it writes at once, so a large answer is not held whole.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes held before a write is made without waiting for a flush.
const MAX_HELD: usize = 256 * 1024;
/// A buffer grown past this by a large answer is let go once written.
const KEEP_CAPACITY: usize = 64 * 1024;

/// The polls of a connection's task, counted for its `Coalesce`.
pub(crate) struct Turns<F> {
    inner: Pin<Box<F>>,
    turn: Arc<AtomicU64>,
}

impl<F: Future> Turns<F> {
    pub(crate) fn new(inner: F, turn: Arc<AtomicU64>) -> Self {
        Turns {
            inner: Box::pin(inner),
            turn,
        }
    }
}

impl<F: Future> Future for Turns<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.turn.fetch_add(1, Ordering::Relaxed);
        this.inner.as_mut().poll(cx)
    }
}

pub(crate) struct Coalesce<S> {
    inner: S,
    turn: Arc<AtomicU64>, // the task's polls (`Turns`)
    out: Vec<u8>,         // bytes taken and not yet written
    written: usize,       // of `out`, those written already
    since: u64,           // the turn in which the oldest byte held was taken
    last: u64,            // the turn in which the newest byte held was taken
}

impl<S: AsyncWrite + Unpin> Coalesce<S> {
    pub(crate) fn new(inner: S, turn: Arc<AtomicU64>) -> Self {
        Coalesce {
            inner,
            turn,
            out: Vec::new(),
            written: 0,
            since: 0,
            last: 0,
        }
    }

    /// Take bytes to write: what turn they came in is kept.
    fn take<'b>(&mut self, bufs: impl IntoIterator<Item = &'b [u8]>) -> usize {
        let now = self.turn.load(Ordering::Relaxed);
        if self.out.is_empty() {
            self.since = now;
        }
        self.last = now;
        let mut taken = 0;
        for buf in bufs {
            self.out.extend_from_slice(buf);
            taken += buf.len();
        }
        taken
    }

    /// Write everything held.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.out.len() {
            let n = match Pin::new(&mut self.inner).poll_write(cx, &self.out[self.written..]) {
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.written = 0;
        if self.out.capacity() > KEEP_CAPACITY {
            self.out = Vec::new();
        } else {
            self.out.clear();
        }
        Poll::Ready(Ok(()))
    }

    /// Room for more: what is held is written first where it is past `MAX_HELD`.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.out.len() >= MAX_HELD {
            return self.poll_drain(cx);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalesce<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesce<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Poll::Ready(Err(e)) = this.poll_room(cx) {
            return Poll::Ready(Err(e));
        }
        if this.out.len() >= MAX_HELD {
            return Poll::Pending; // (woken when the socket takes more)
        }
        Poll::Ready(Ok(this.take([buf])))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Poll::Ready(Err(e)) = this.poll_room(cx) {
            return Poll::Ready(Err(e));
        }
        if this.out.len() >= MAX_HELD {
            return Poll::Pending;
        }
        Poll::Ready(Ok(this.take(bufs.iter().map(|b| &**b))))
    }

    fn is_write_vectored(&self) -> bool {
        true // (each slice is copied: none is written on its own)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.out.is_empty() {
            return Pin::new(&mut this.inner).poll_flush(cx);
        }
        let now = this.turn.load(Ordering::Relaxed);
        if this.last == now && this.since + 1 >= now {
            // bytes came this turn, and none has waited a whole one: held to the next
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        match this.poll_drain(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.poll_drain(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// What is written comes out whole and in order, across held flushes, flushes that
    /// write, writes past `MAX_HELD` and the shutdown.
    #[test]
    fn writes_come_out_whole_and_in_order() {
        runtime().block_on(async {
            let (a, mut b) = tokio::io::duplex(64 * 1024);
            let reader = tokio::spawn(async move {
                let mut got = Vec::new();
                b.read_to_end(&mut got).await.unwrap();
                got
            });
            let turn = Arc::new(AtomicU64::new(0));
            let mut sent = Vec::new();
            let mut out = Coalesce::new(a, Arc::clone(&turn));
            for i in 0..200u32 {
                let chunk = vec![(i % 251) as u8; (i as usize * 37) % 5000 + 1];
                out.write_all(&chunk).await.unwrap();
                sent.extend_from_slice(&chunk);
                if i % 7 == 0 {
                    turn.fetch_add(1, Ordering::Relaxed);
                    out.flush().await.unwrap(); // held, or written
                }
            }
            let big = vec![9u8; MAX_HELD * 2 + 3];
            out.write_all(&big).await.unwrap();
            sent.extend_from_slice(&big);
            out.flush().await.unwrap();
            out.shutdown().await.unwrap();
            assert_eq!(reader.await.unwrap(), sent);
        });
    }

    /// A flush in the turn that wrote holds the bytes; the next turn's flush writes them,
    /// and so does a flush once they have waited a whole turn, however much comes meanwhile.
    #[test]
    fn a_flush_writes_what_a_turn_before_took() {
        runtime().block_on(async {
            let (a, mut b) = tokio::io::duplex(64 * 1024);
            let turn = Arc::new(AtomicU64::new(1));
            let mut out = Coalesce::new(a, Arc::clone(&turn));
            let mut got = [0u8; 16];
            out.write_all(b"ping").await.unwrap();
            out.flush().await.unwrap();
            assert_eq!(out.out.len(), 4); // held
            turn.fetch_add(1, Ordering::Relaxed);
            out.write_all(b"answer").await.unwrap();
            out.flush().await.unwrap();
            assert_eq!(out.out.len(), 10); // this turn wrote: held still
            turn.fetch_add(1, Ordering::Relaxed);
            out.write_all(b"more").await.unwrap();
            out.flush().await.unwrap(); // "ping" waited a whole turn: all written
            assert!(out.out.is_empty());
            let n = b.read(&mut got).await.unwrap();
            assert_eq!(&got[..n], b"pinganswermore");
            out.write_all(b"x").await.unwrap();
            out.flush().await.unwrap();
            turn.fetch_add(1, Ordering::Relaxed);
            out.flush().await.unwrap(); // nothing taken this turn: written
            let n = b.read(&mut got).await.unwrap();
            assert_eq!(&got[..n], b"x");
        });
    }
}
