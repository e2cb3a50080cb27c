//! The response body streamed back to the client: the engine's body, frame
//! by frame, carrying the request's reservation (docs/ROUTING.md, "A
//! request's lifecycle"). The first data frame is `prefill_done`, the end
//! of the engine's body `complete` (`fail` when the engine answered with an
//! error status), an engine error or a read timeout `fail` (the client's
//! connection is then aborted, so it sees an error, not a short answer);
//! a client that goes away drops this body and the reservation with it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use engine_state_router::Reservation;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Sleep;

use crate::metrics::ProxyMetrics;

/// The error a stream ends with; the client's connection is aborted.
pub(crate) type StreamError = Box<dyn std::error::Error + Send + Sync>;

/// An engine's response body that holds the request's reservation.
pub(crate) struct ReservedBody {
    upstream: Incoming,
    /// `Some` until released.
    reservation: Option<Reservation>,
    metrics: Arc<ProxyMetrics>,
    engine: String,
    forwarded_at: Instant,
    first_chunk_seen: bool,
    /// The engine answered 2xx: the end of its body is a completion.
    success: bool,
    read_timeout: Duration,
    /// When the engine's next frame is late.
    deadline: Pin<Box<Sleep>>,
}

impl ReservedBody {
    pub fn new(
        upstream: Incoming,
        reservation: Reservation,
        metrics: Arc<ProxyMetrics>,
        forwarded_at: Instant,
        success: bool,
        read_timeout: Duration,
    ) -> ReservedBody {
        let mut body = ReservedBody {
            upstream,
            engine: reservation.instance_id().to_owned(),
            reservation: Some(reservation),
            metrics,
            forwarded_at,
            first_chunk_seen: false,
            success,
            read_timeout,
            deadline: Box::pin(tokio::time::sleep(read_timeout)),
        };
        if body.upstream.is_end_stream() {
            // An empty body: nothing will be polled.
            body.finish();
        }
        body
    }

    /// The engine's body ended: `complete` after a 2xx, else `fail` (the
    /// status was counted as an error when the head arrived).
    fn finish(&mut self) {
        if let Some(mut reservation) = self.reservation.take() {
            if self.success {
                reservation.complete();
            } else {
                reservation.fail();
            }
        }
    }

    fn fail(&mut self, kind: &str) {
        if let Some(mut reservation) = self.reservation.take() {
            reservation.fail();
            self.metrics.engine(&self.engine).upstream_error(kind);
        }
    }
}

impl Body for ReservedBody {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        let this = self.get_mut();
        if this.reservation.is_none() {
            // Ended (or failed) already.
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.upstream).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if frame.is_data() && !this.first_chunk_seen {
                    this.first_chunk_seen = true;
                    this.metrics
                        .engine(&this.engine)
                        .first_chunk(this.forwarded_at.elapsed());
                    if let Some(reservation) = this.reservation.as_mut() {
                        reservation.prefill_done();
                    }
                }
                if this.upstream.is_end_stream() {
                    // A body of known length (a non-streamed answer, an
                    // error): the server stops polling after its last byte,
                    // so it ends here, not at a `None` that never comes.
                    this.finish();
                } else {
                    let next = tokio::time::Instant::now() + this.read_timeout;
                    this.deadline.as_mut().reset(next);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                this.fail("stream");
                Poll::Ready(Some(Err(format!(
                    "engine {} failed mid-stream: {error}",
                    this.engine
                )
                .into())))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    this.fail("timeout");
                    let timeout = this.read_timeout;
                    return Poll::Ready(Some(Err(format!(
                        "engine {} sent nothing for {timeout:?} (--read-timeout-ms)",
                        this.engine
                    )
                    .into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.reservation.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.upstream.size_hint()
    }
}

impl Drop for ReservedBody {
    /// The client went away before the engine's body ended: the reservation
    /// is dropped (released); dropping `upstream` closes the engine's
    /// connection, which aborts the request there.
    fn drop(&mut self) {
        if self.reservation.is_some() {
            self.metrics.client_cancels.increment(1);
        }
    }
}
