//! The streamed answer path, beside the one-shot one ([`super::protocols::native`]): a job whose
//! chunks go to the client as Server-Sent Events or NDJSON as they arrive ([`super::events`]).
//!
//! Until the first chunk the answer is still undecided: every error known by then (a shed, a 422
//! from preprocess, a 408 when nothing came by the job's deadline) is a plain HTTP error with its
//! status. From the first chunk on the status is 200 and the stream carries the rest: chunks, then
//! `done`, or an `error` event. The whole stream is bounded by `--stream-timeout-ms`, whatever
//! the job's deadline; past it the stream ends with `deadline_exceeded`. However the answer ends
//! — done, error, timeout, or hyper dropping it because the client left — the job's `left` token
//! is cancelled with it, and a worker still holding the job is told to stop. A quiet SSE stream
//! is kept alive with comment lines ([`KeepAlive`]).

use std::convert::Infallible;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::DropGuard;

use super::error::ApiError;
use super::events::Framing;
use super::{shed_error, App, Body, Route};
use crate::job::{Outcome, Reply};
use crate::metrics::{metrics, StreamCut};
use crate::pipeline::{self, Input};
use crate::stream::{self as chunks, ChunkSource};
use crate::timing;
use crate::traffic::Traffic;

/// Streams one job's answer. The route's earlier stages (if any) answer one-shot first: only a
/// pipeline's last stage streams.
pub async fn answer(
    app: &App,
    route: &Route,
    input: Input,
    arrived: Instant,
    deadline: Instant,
    mut traffic: Traffic,
    framing: Framing,
) -> Result<Response<Body>, ApiError> {
    let shed = |shed| shed_error(shed, traffic.class);
    // The stream timeout bounds the whole answer: a deadline past it (a route's timeout longer
    // than its stage's stream timeout) does not lift it, and it bounds the first chunk too.
    let last = route.pipeline.last();
    let stream_deadline = arrived + last.stream_timeout();
    let deadline = deadline.min(stream_deadline);
    traffic.budget = traffic.budget.map(|budget| budget.min(last.stream_timeout()));
    // The stages before the last answer one-shot: their workers keep the route's allowance, as
    // for any client. Capped there too, a plain worker of an earlier stage was killed as hung
    // past the stream timeout + 1 s, where its route allows longer: a client's `Accept` had
    // got a healthy worker killed.
    let inputs = route
        .pipeline
        .run_before_last(vec![input], deadline, app.retries, traffic)
        .await
        .map_err(shed)?;
    let (entered, input, traffic) = match inputs {
        Ok(pipeline::AtLast { entered, mut inputs, mut traffic }) => {
            let stream_timeout = last.stream_timeout();
            traffic.allowance = traffic.allowance.map(|allowance| allowance.min(stream_timeout));
            (entered, inputs.pop().expect("one job in, one out"), traffic)
        }
        Err(outcomes) => {
            let outcome = outcomes.into_iter().next().expect("one job in, one outcome out");
            return Err(ApiError::from_outcome(outcome));
        }
    };

    let (sink, mut source) = chunks::channel(app.stream_buffer_bytes);
    // Until the first chunk or the outcome, the job may still be queued: a client that leaves
    // meanwhile has it purged (`departure`).
    let inputs = vec![input];
    let mut queued =
        pipeline::submit(last, inputs, entered, deadline, app.retries, traffic, Some(sink))
            .map_err(shed)?;
    let mut reply = queued.answers.pop().expect("one job in, one answer");
    let left = queued.left.pop().expect("one job in, one guard");
    let departure = &mut queued.departure;

    // Where the time went until the first chunk (or the 408): the timing its headers carry, and
    // its queue span, linked to the batch that carried it, as a one-shot job's. (A stream
    // answered 408 before its first chunk had the admission span alone: yet where a slow
    // stream's time went is what its trace is opened for.)
    let mut queue_span = queued.queue_span.take();
    let mut record_wait = |sent: Option<crate::job::Sent>| {
        timing::record_stream(entered, sent, Instant::now());
        if let Some(span) = queue_span.take() {
            span.record(sent.into_iter());
        }
    };
    // The first chunk, or the outcome, by the job's deadline; before it, errors are plain.
    let mut first = Vec::new();
    let outcome = tokio::select! {
        biased;
        chunk = source.next() => match chunk {
            Some(chunk) => {
                first.push(chunk);
                None
            }
            // The job was answered without a chunk: its outcome is on its way.
            None => Some(outcome(&mut reply).await),
        },
        answered = &mut reply => {
            // Every chunk was pushed before the outcome, maybe since `source` was polled just
            // above: they go first.
            while let Some(chunk) = source.try_next() {
                first.push(chunk);
            }
            Some(answered.map(|r| r.outcome).unwrap_or_else(dropped))
        }
        _ = tokio::time::sleep_until(deadline) => {
            // Still queued (or queued again, given back by a worker that died), the job leaves
            // the queue now, as a one-shot job answered 408 does: `Departure`'s purge, as it
            // drops here; taken by a worker, the purge finds nothing.
            // A batch that ran past the deadline is where its time went.
            record_wait(source.sent());
            return Err(ApiError::deadline_exceeded());
        }
    };
    // The job left the queue: its first chunk or outcome came.
    departure.ended();
    // The stream's headers go with its first chunk: its batch time is the time to that chunk.
    record_wait(source.sent());
    let produced = outcome.as_ref().is_none_or(|o| matches!(o, Outcome::Done(..) | Outcome::Ended));
    timing::rows_done(usize::from(produced));
    let mut pending: Vec<Bytes> = Vec::new();
    let mut finished = false;
    for chunk in first {
        match framing.try_chunk(chunk) {
            Ok(event) => pending.push(event),
            // Nothing has gone out: a first chunk with no JSON form is still a plain error (it
            // had been a 200 whose one event was the error).
            Err(error) if pending.is_empty() => {
                source.end_here();
                return Err(error);
            }
            Err(error) => {
                source.end_here();
                pending.push(framing.error(&error));
                finished = true;
                break;
            }
        }
    }
    let streamed = !pending.is_empty();
    match outcome {
        None => {}
        Some(_) if finished => {}
        Some(Outcome::Done(data, _)) if !streamed => {
            pending.push(framing.try_chunk(data)?);
            pending.push(framing.done());
            finished = true;
        }
        Some(Outcome::Done(data, _)) => {
            pending.extend(last_chunk(framing, data));
            finished = true;
        }
        Some(Outcome::Ended) => {
            pending.push(framing.done());
            finished = true;
        }
        // After chunks, a failure is the stream's error event, as later in the stream.
        Some(other) if streamed => {
            pending.push(framing.error(&ApiError::from_outcome(other)));
            finished = true;
        }
        Some(other) => return Err(ApiError::from_outcome(other)),
    }
    let events = Events {
        framing,
        source,
        reply,
        deadline: Box::pin(tokio::time::sleep_until(stream_deadline)),
        stream_timeout: last.stream_timeout(),
        keepalive: KeepAlive::new(framing, app.stream_keepalive),
        pending: pending.into(),
        finished,
        _left: left,
        _open: Open::new(),
    };
    let body = StreamBody::new(stream::unfold(events, Events::next_frame));
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, framing.content_type())
        .header(CACHE_CONTROL, "no-cache")
        // Proxies in front (nginx) must pass events on as they come.
        .header("x-accel-buffering", "no")
        .body(BodyExt::boxed_unsync(body))
        .expect("static headers are valid"))
}

/// A chunk as an event; one that has no JSON form ends the stream with an error event.
fn event(framing: Framing, chunk: Bytes, finished: &mut bool, source: &ChunkSource) -> Bytes {
    framing.chunk(chunk).unwrap_or_else(|error| {
        *finished = true;
        source.end_here();
        error
    })
}

/// A one-shot answer as the last chunk of a stream, then `done` (or the error event alone).
fn last_chunk(framing: Framing, data: Bytes) -> Vec<Bytes> {
    match framing.chunk(data) {
        Ok(chunk) => vec![chunk, framing.done()],
        Err(error) => vec![error],
    }
}

async fn outcome(reply: &mut oneshot::Receiver<Reply>) -> Outcome {
    reply.await.map(|r| r.outcome).unwrap_or_else(dropped)
}

/// Only a bug drops a job unanswered; say so rather than hang or guess.
fn dropped(_: oneshot::error::RecvError) -> Outcome {
    Outcome::WorkerLost("the job was dropped without an answer".into())
}

/// The rest of a stream, as body frames.
struct Events {
    framing: Framing,
    source: ChunkSource,
    reply: oneshot::Receiver<Reply>,
    deadline: Pin<Box<Sleep>>,
    /// The stage's stream timeout, which `deadline` is (from the request's arrival).
    stream_timeout: Duration,
    keepalive: KeepAlive,
    /// Events ready to go out before anything else.
    pending: std::collections::VecDeque<Bytes>,
    /// The last event is out (or queued in `pending`).
    finished: bool,
    /// Cancels the job's `left` token when the answer ends, however it ends.
    _left: DropGuard,
    _open: Open,
}

impl Events {
    async fn next_frame(mut self) -> Option<(Result<Frame<Bytes>, Infallible>, Self)> {
        if let Some(event) = self.pending.pop_front() {
            return Some((Ok(Frame::data(event)), self));
        }
        if self.finished {
            self._open.finished = true;
            return None;
        }
        self.keepalive.sent(Instant::now());
        let event = loop {
            let event = tokio::select! {
            // The timeout first: with chunks always buffered (a client reading about as fast as
            // the worker writes), a branch below it would never let it run, and the stream and
            // its worker went on past it (8 s of a 1 s timeout).
            biased;
            _ = &mut self.deadline => {
                self.finished = true;
                self._open.finished = true;
                // Ended by a failure before its timeout (cut off as slow while its client
                // stalled, a worker that died, a broken chunk), the stream ends with that
                // failure: a client reading again past the timeout had been told
                // `deadline_exceeded`, and a slow one counted under both reasons. A stream
                // that ended well still ends at its timeout, as documented.
                match self.reply.try_recv() {
                    Ok(Reply { outcome, .. })
                        if !matches!(outcome, Outcome::Ended | Outcome::Done(..)) =>
                    {
                        self.framing.error(&ApiError::from_outcome(outcome))
                    }
                    _ => self.timed_out(),
                }
            }
            chunk = self.source.next() => match chunk {
                Some(chunk) => event(self.framing, chunk, &mut self.finished, &self.source),
                None => {
                    let outcome = outcome(&mut self.reply).await;
                    self.end(outcome)
                }
            },
            answered = &mut self.reply => {
                // Every chunk was pushed before the outcome: they go first.
                while let Some(chunk) = self.source.try_next() {
                    if self.finished {
                        break;
                    }
                    let event = event(self.framing, chunk, &mut self.finished, &self.source);
                    self.pending.push_back(event);
                }
                self.end(answered.map(|r| r.outcome).unwrap_or_else(dropped))
            }
            // Last: only a stream with nothing else to send is kept alive.
            () = self.keepalive.due() => match self.keepalive.comment(Instant::now()) {
                Some(comment) => comment,
                None => continue,
            },
            };
            break event;
        };
        Some((Ok(Frame::data(event)), self))
    }

    /// The stream timeout's error event, counted as a stream cut at its deadline.
    fn timed_out(&self) -> Bytes {
        metrics().stream_cut(StreamCut::Deadline).inc();
        self.framing.error(&ApiError::stream_timeout(self.stream_timeout))
    }

    /// Queues the last events for the job's outcome and returns the first event due.
    fn end(&mut self, outcome: Outcome) -> Bytes {
        // The stream reached its end: a client that stops reading now did not leave it early
        // (a slow client is counted where it was cut off).
        self._open.finished = true;
        if !self.finished {
            self.finished = true;
            match outcome {
                // Past the stream's timeout, an end is the one the connection asked for: it ends
                // a stream for the worker at its timeout (`end_streams`), and on a runtime kept
                // busy (a worker flooding chunks) the worker's `end` was read here before the
                // timer above had fired. A quarter of the streams cut so told their clients
                // `done`, their answers cut short.
                Outcome::Ended | Outcome::Done(..)
                    if Instant::now() >= self.deadline.deadline() =>
                {
                    let event = self.timed_out();
                    self.pending.push_back(event);
                }
                Outcome::Ended => self.pending.push_back(self.framing.done()),
                Outcome::Done(data, _) => self.pending.extend(last_chunk(self.framing, data)),
                other => self.pending.push_back(self.framing.error(&ApiError::from_outcome(other))),
            }
        }
        self.pending.pop_front().unwrap_or_else(|| self.framing.done())
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        // A client cut off as slow was counted so where it was cut off; leaving afterwards,
        // without reading its error event, it is not counted a second time as one that left.
        let reply = self.reply.try_recv();
        if reply.is_ok_and(|reply| matches!(reply.outcome, Outcome::SlowClient)) {
            self._open.finished = true;
        }
    }
}

/// A Server-Sent Events stream's keep-alive: a comment line once it has gone `every` without
/// an event. The timer is moved only when it fires (to the last event's time plus `every`, if
/// an event went since), not at every event: a stream of tokens would reset it thousands of
/// times a second. NDJSON has no comment to send, and is not kept alive.
struct KeepAlive {
    every: Option<Duration>,
    last: Instant,
    timer: Pin<Box<Sleep>>,
}

impl KeepAlive {
    fn new(framing: Framing, every: Option<Duration>) -> Self {
        let now = Instant::now();
        // A period past the clock's range is none (the flag bounds it to a day).
        let first = every.and_then(|every| now.checked_add(every));
        let every = every.filter(|_| framing == Framing::Sse && first.is_some());
        let timer = Box::pin(tokio::time::sleep_until(first.unwrap_or(now)));
        KeepAlive { every, last: now, timer }
    }

    /// An event went to the client at `now`.
    fn sent(&mut self, now: Instant) {
        self.last = now;
    }

    /// Ready when the timer fires; never without a keep-alive.
    async fn due(&mut self) {
        match self.every {
            Some(_) => self.timer.as_mut().await,
            None => std::future::pending().await,
        }
    }

    /// The comment, if the stream has been quiet long enough by `now`; the timer set again
    /// either way.
    fn comment(&mut self, now: Instant) -> Option<Bytes> {
        let every = self.every?;
        let due = self.last + every;
        if now < due {
            self.timer.as_mut().reset(due);
            return None;
        }
        self.last = now;
        self.timer.as_mut().reset(now + every);
        Some(Bytes::from_static(b": keep-alive\n\n"))
    }
}

/// Counts an open stream; one dropped before its last event is a client that left.
struct Open {
    finished: bool,
}

impl Open {
    fn new() -> Self {
        metrics().streams_open.inc();
        Self { finished: false }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        metrics().streams_open.dec();
        if !self.finished {
            metrics().stream_cut(StreamCut::ClientLeft).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by the tests that count `corral_streams_cancelled_total{reason="deadline"}`, a
    /// process-wide counter: one read before and after the other's count moved it.
    static DEADLINE_COUNT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// An SSE stream's events, whose stream timeout is a second from now.
    fn sse(source: ChunkSource, reply: oneshot::Receiver<Reply>) -> Events {
        Events {
            framing: Framing::Sse,
            source,
            reply,
            deadline: Box::pin(tokio::time::sleep(Duration::from_secs(1))),
            stream_timeout: Duration::from_secs(1),
            keepalive: KeepAlive::new(Framing::Sse, None),
            pending: Default::default(),
            finished: false,
            _left: tokio_util::sync::CancellationToken::new().drop_guard(),
            _open: Open::new(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_end_read_past_the_stream_s_timeout_is_the_timeout_not_done() {
        // The race a busy runtime runs: the worker's `end` for a stream the connection cut at its
        // timeout is read before the timer has fired (`end` is what the answered branch calls).
        let (_sink, source) = chunks::channel(1 << 20);
        let (_answer, reply) = oneshot::channel();
        let mut events = sse(source, reply);
        let _counting = DEADLINE_COUNT.lock().await;
        let deadline = || metrics().stream_cut(StreamCut::Deadline).get();
        let before = deadline();
        tokio::time::advance(Duration::from_secs(1)).await;
        let event = events.end(Outcome::Ended);
        let text = std::str::from_utf8(&event).unwrap();
        assert!(text.starts_with("event: error") && text.contains("deadline_exceeded"), "{text}");
        assert!(events.pending.is_empty(), "no done after it");
        assert_eq!(deadline(), before + 1, "counted as cut at its timeout");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_cut_off_as_slow_ends_so_when_read_past_its_timeout() {
        let (sink, source) = chunks::channel(1 << 20);
        sink.push(Bytes::from_static(b"\xa1a")).unwrap();
        let (answer, reply) = oneshot::channel();
        answer
            .send(Reply { outcome: Outcome::SlowClient, batch: None, class: Default::default() })
            .unwrap();
        let events = sse(source, reply);
        let _counting = DEADLINE_COUNT.lock().await;
        let deadline = || metrics().stream_cut(StreamCut::Deadline).get();
        let before = deadline();
        // The client reads again only past the stream's timeout.
        tokio::time::advance(Duration::from_secs(2)).await;
        let (frame, events) = events.next_frame().await.unwrap();
        let event = frame.unwrap().into_data().unwrap();
        let text = std::str::from_utf8(&event).unwrap();
        assert!(text.starts_with("event: error") && text.contains("slow_client"), "{text}");
        assert!(events.next_frame().await.is_none());
        assert_eq!(deadline(), before, "counted as slow where it was cut off, not again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_sse_stream_gets_a_comment_and_ndjson_none() {
        let every = Some(Duration::from_secs(15));
        let mut keepalive = KeepAlive::new(Framing::Sse, every);
        tokio::time::advance(Duration::from_secs(10)).await;
        keepalive.sent(Instant::now());
        // The timer set at the start fires at 15 s; an event went at 10 s: not quiet yet.
        tokio::time::advance(Duration::from_secs(5)).await;
        keepalive.due().await;
        assert_eq!(keepalive.comment(Instant::now()), None);
        // Set again for 25 s, when it is.
        tokio::time::advance(Duration::from_secs(10)).await;
        keepalive.due().await;
        assert_eq!(keepalive.comment(Instant::now()).as_deref(), Some(&b": keep-alive\n\n"[..]));
        // NDJSON has no comment a client would skip: never due.
        let mut ndjson = KeepAlive::new(Framing::Ndjson, every);
        assert_eq!(ndjson.comment(Instant::now()), None);
        let never = tokio::time::timeout(Duration::from_secs(3600), ndjson.due()).await;
        assert!(never.is_err());
    }
}
