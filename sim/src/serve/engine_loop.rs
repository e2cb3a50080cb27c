//! One served engine's thread: the engine model's step loop against the
//! wall clock (each step lasts its modelled duration divided by the time
//! scale), requests and aborts applied between steps as vLLM applies them,
//! every sampled token sent to its request's channel, and engine-state
//! published through the real `Publisher` by the hook's capture rule
//! (docs/VLLM.md, "When it captures"): at a step boundary at most every
//! period, and at once when the engine turns busy or idle, the cache digest
//! before the snapshot that names it.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine_state_publisher::Publisher;
use engine_state_shm_format::default_cache_capacity;
use tokio::sync::mpsc::UnboundedSender;

use crate::engine::{Engine, EngineRequest, ScheduledStep};
use crate::profile::KV_BLOCK_TOKENS;

/// What the HTTP side asks of an engine.
#[derive(Debug)]
pub enum Command {
    /// Queue a request; its tokens go to `events`.
    Add {
        /// The request (its id unique in this engine).
        request: EngineRequest,
        /// Where its sampled tokens go.
        events: UnboundedSender<Sampled>,
    },
    /// The client went away: remove the request.
    Abort(u64),
}

/// One sampled token of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampled {
    /// Its position in the output (0: the first token).
    pub index: u64,
    /// The last one: the request finished.
    pub last: bool,
}

/// What `/metrics` shows, updated at every step boundary.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gauges {
    /// Running requests.
    pub running: u64,
    /// Waiting requests (preempted ones included).
    pub waiting: u64,
    /// Fraction of KV blocks in use (vLLM's `kv_cache_usage_perc`).
    pub kv_usage: f64,
    /// Prefix-cache tokens looked up at first admissions.
    pub prefix_queries: u64,
    /// Prefix-cache tokens hit at first admissions.
    pub prefix_hits: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// Requests finished (all by length).
    pub finished: u64,
    /// Requests aborted.
    pub aborted: u64,
}

/// The engine thread's settings.
#[derive(Debug)]
pub struct LoopSettings {
    /// Modelled time runs this many times faster than the wall clock.
    pub time_scale: f64,
    /// The capture period (and the publisher's heartbeat period).
    pub period: Duration,
}

struct Live {
    events: UnboundedSender<Sampled>,
    output_len: u64,
    sent: u64,
}

/// Run an engine until every sender of `commands` is gone; then close the
/// publisher (its file is removed).
pub fn run(
    mut engine: Engine,
    mut publisher: Publisher,
    commands: Receiver<Command>,
    gauges: Arc<Mutex<Gauges>>,
    settings: LoopSettings,
) {
    let capacity = default_cache_capacity(engine.total_blocks() as u64, KV_BLOCK_TOKENS);
    publisher.set_cache_kv_block_size(KV_BLOCK_TOKENS as u32);
    let started = Instant::now();
    let mut state = LoopState {
        live: HashMap::new(),
        last_capture: None,
        capacity,
        started,
        warned: false,
    };
    state.capture(&mut engine, &mut publisher);
    let mut pending = Vec::new();
    let mut step_start = Instant::now();
    'outer: loop {
        if engine.num_requests() == 0 {
            match commands.recv() {
                Ok(command) => pending.push(command),
                Err(_) => break,
            }
            step_start = Instant::now();
        }
        while let Ok(command) = commands.try_recv() {
            pending.push(command);
        }
        let was_idle = engine.num_requests() == 0;
        for command in pending.drain(..) {
            state.apply(&mut engine, command, &gauges);
        }
        if engine.num_requests() == 0 {
            // Aborts emptied it between steps: it turned idle.
            if !was_idle {
                state.capture(&mut engine, &mut publisher);
            }
            state.update(&engine, &gauges);
            continue;
        }
        let step = engine.schedule();
        state.update(&engine, &gauges);
        if was_idle || state.due(settings.period) {
            state.capture(&mut engine, &mut publisher);
        }
        if step.is_empty() {
            // Cannot happen for requests that fit (checked at admission);
            // wait for an abort rather than spin.
            state.update(&engine, &gauges);
            match commands.recv_timeout(Duration::from_millis(10)) {
                Ok(command) => pending.push(command),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            continue;
        }
        let wall = Duration::from_nanos((step.duration_ns as f64 / settings.time_scale) as u64);
        let deadline = step_start + wall;
        loop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            match commands.recv_timeout(deadline - now) {
                Ok(command) => pending.push(command),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => break 'outer,
            }
        }
        state.finish(&mut engine, &step, &gauges);
        // The next step starts where this one ended in modelled time, unless
        // the thread fell behind (a busy machine): then from now.
        let now = Instant::now();
        step_start = match now.duration_since(deadline) > Duration::from_millis(20) {
            true => now,
            false => deadline,
        };
        for command in pending.drain(..) {
            state.apply(&mut engine, command, &gauges);
        }
        if engine.num_requests() == 0 {
            state.capture(&mut engine, &mut publisher);
        }
        state.update(&engine, &gauges);
    }
    publisher.close();
}

struct LoopState {
    live: HashMap<u64, Live>,
    last_capture: Option<Instant>,
    capacity: usize,
    started: Instant,
    warned: bool,
}

impl LoopState {
    fn apply(&mut self, engine: &mut Engine, command: Command, gauges: &Mutex<Gauges>) {
        match command {
            Command::Add { request, events } => {
                let live = Live {
                    events,
                    output_len: request.output_len.max(1),
                    sent: 0,
                };
                self.live.insert(request.id, live);
                engine.add_request(request);
            }
            Command::Abort(id) => self.abort(engine, id, gauges),
        }
    }

    fn abort(&mut self, engine: &mut Engine, id: u64, gauges: &Mutex<Gauges>) {
        self.live.remove(&id);
        if engine.abort(id) {
            lock(gauges).aborted += 1;
        }
    }

    /// Apply a finished step and send every token it sampled (the gauges
    /// first: a client that saw a token sees them as of it); a request
    /// whose receiver is gone (its client left) is aborted at once.
    fn finish(&mut self, engine: &mut Engine, step: &ScheduledStep, gauges: &Mutex<Gauges>) {
        let output = engine.finish_step(step);
        let mut sends = Vec::new();
        for &(id, _) in &step.scheduled {
            let Some(live) = self.live.get(&id) else {
                continue;
            };
            let upto = match output.finished.contains(&id) {
                true => live.output_len,
                false => engine.num_output(id).unwrap_or(live.sent),
            };
            if upto > live.sent {
                sends.push((id, upto));
            }
        }
        self.update(engine, gauges);
        {
            let mut g = lock(gauges);
            g.generation_tokens += sends
                .iter()
                .map(|&(id, upto)| upto - self.live[&id].sent)
                .sum::<u64>();
            g.finished += output.finished.len() as u64;
            g.prompt_tokens += step
                .admitted
                .iter()
                .filter(|a| !a.resumed)
                .map(|a| a.query_tokens)
                .sum::<u64>();
        }
        let mut gone = Vec::new();
        for (id, upto) in sends {
            let live = self.live.get_mut(&id).expect("collected above");
            while live.sent < upto {
                let sampled = Sampled {
                    index: live.sent,
                    last: live.sent + 1 == live.output_len,
                };
                live.sent += 1;
                if live.events.send(sampled).is_err() {
                    gone.push(id);
                    break;
                }
            }
            if live.sent == live.output_len {
                self.live.remove(&id);
            }
        }
        for id in gone {
            self.abort(engine, id, gauges);
        }
    }

    fn due(&self, period: Duration) -> bool {
        self.last_capture.is_none_or(|at| at.elapsed() >= period)
    }

    /// The hook's capture: the cache digest, then the snapshot.
    fn capture(&mut self, engine: &mut Engine, publisher: &mut Publisher) {
        self.last_capture = Some(Instant::now());
        let now_ns = self.started.elapsed().as_nanos() as u64;
        if let Some(digest) = engine.cache_digest(now_ns) {
            let blocks = &digest.blocks()[..digest.len().min(self.capacity)];
            if let Err(e) = publisher.publish_cache(blocks, digest.held(), self.capacity) {
                self.warn(publisher.engine_id(), &e);
            }
        }
        if let Err(e) = publisher.publish(engine.snapshot()) {
            self.warn(publisher.engine_id(), &e);
        }
    }

    fn warn(&mut self, engine_id: &str, error: &dyn std::fmt::Display) {
        if !self.warned {
            self.warned = true;
            eprintln!("essim serve: {engine_id}: publishing failed: {error} (said once)");
        }
    }

    fn update(&self, engine: &Engine, gauges: &Mutex<Gauges>) {
        let s = engine.snapshot();
        let c = engine.counters();
        let mut g = lock(gauges);
        g.running = s.num_running;
        g.waiting = s.num_waiting;
        g.kv_usage = 1.0 - engine.free_blocks() as f64 / engine.total_blocks() as f64;
        g.prefix_queries = c.prefix_query_tokens;
        g.prefix_hits = c.prefix_hit_tokens;
        g.preemptions = c.preemptions;
    }
}

/// Lock the gauges (a panicked holder left plain numbers: still usable).
pub fn lock(gauges: &Mutex<Gauges>) -> std::sync::MutexGuard<'_, Gauges> {
    gauges.lock().unwrap_or_else(|e| e.into_inner())
}
