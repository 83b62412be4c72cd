//! Streams and events of the emulated driver (tests only). Work queued on a stream runs only
//! when the host waits for it (a stream or event synchronisation, a copy into pageable
//! memory, a free), in order; a stream that waits on an event first runs the recording
//! stream up to that event. That is the latest schedule a GPU may choose, so a wait the
//! backend forgets shows up as stale data instead of passing by luck. An error of queued work
//! is kept and returned by the stream's next synchronisation, as the driver does.
//!
//! A stream runs on one thread at a time, and a wait runs the other stream while holding
//! its own: two streams with waits on each other queued and run from two threads at once
//! would block each other (a GPU would not). The tests never queue such a pair.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::error::{Error, Result};

/// One piece of queued work.
pub(super) type Op = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Default)]
struct Stream {
    queue: VecDeque<Op>,
    error: Option<Error>,
    /// Held while the stream's work runs, so that work of one stream never runs on two
    /// threads at once (tests share the emulated devices).
    running: Arc<Mutex<()>>,
}

struct Event {
    /// The stream of the latest record.
    stream: u64,
    /// Records so far, and how many of them have run.
    recorded: u64,
    fired: u64,
    live: bool,
}

#[derive(Default)]
struct State {
    streams: HashMap<u64, Stream>,
    events: HashMap<u64, Event>,
    next_event: u64,
}

fn state() -> MutexGuard<'static, State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            let mut s = State {
                next_event: 0x0e0e_0000,
                ..State::default()
            };
            // The legacy and per-thread default streams, which consumers may name.
            s.streams.insert(1, Stream::default());
            s.streams.insert(2, Stream::default());
            Mutex::new(s)
        })
        .lock()
        .expect("emulated stream lock")
}

fn invalid(op: &str, what: String) -> Error {
    Error::Backend {
        backend: "cuda",
        op: op.into(),
        message: format!("CUDA_ERROR_INVALID_HANDLE: {what}"),
    }
}

/// Registers a stream handle.
pub(super) fn add_stream(s: u64) {
    state().streams.entry(s).or_default();
}

/// Queues `op` on stream `s`.
pub(super) fn enqueue(s: u64, op: Op, name: &str) -> Result<()> {
    match state().streams.get_mut(&s) {
        Some(st) => {
            st.queue.push_back(op);
            Ok(())
        }
        None => Err(invalid(name, format!("stream {s:#x}"))),
    }
}

/// Runs the work queued on `s` until `done` holds or the queue is empty.
fn run_until(s: u64, done: &dyn Fn(&State) -> bool) {
    let Some(running) = state().streams.get(&s).map(|q| q.running.clone()) else {
        return;
    };
    let _running = running.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let op = {
            let mut st = state();
            if done(&st) {
                return;
            }
            match st.streams.get_mut(&s).and_then(|q| q.queue.pop_front()) {
                Some(op) => op,
                None => return,
            }
        };
        // Run without the lock: the op may run other streams (an event wait) or allocate.
        if let Err(e) = op() {
            let mut st = state();
            let q = st.streams.get_mut(&s).expect("streams are never removed");
            q.error.get_or_insert(e);
        }
    }
}

/// Runs everything queued on `s`; returns (and clears) the first error of its work.
pub(super) fn synchronize(s: u64) -> Result<()> {
    run_until(s, &|_| false);
    match state().streams.get_mut(&s).and_then(|q| q.error.take()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Runs everything queued on every stream (errors stay with their streams).
pub(super) fn drain_all() {
    let streams: Vec<u64> = state().streams.keys().copied().collect();
    for s in streams {
        run_until(s, &|_| false);
    }
}

pub(super) fn event_create() -> u64 {
    let mut st = state();
    st.next_event += 1;
    let ev = st.next_event;
    st.events.insert(
        ev,
        Event {
            stream: 1,
            recorded: 0,
            fired: 0,
            live: true,
        },
    );
    ev
}

fn live_event<'a>(st: &'a mut State, ev: u64, op: &str) -> Result<&'a mut Event> {
    match st.events.get_mut(&ev) {
        Some(e) if e.live => Ok(e),
        _ => Err(invalid(op, format!("event {ev:#x}"))),
    }
}

pub(super) fn event_record(ev: u64, s: u64) -> Result<()> {
    let generation = {
        let mut st = state();
        if !st.streams.contains_key(&s) {
            return Err(invalid("cuEventRecord", format!("stream {s:#x}")));
        }
        let e = live_event(&mut st, ev, "cuEventRecord")?;
        e.stream = s;
        e.recorded += 1;
        e.recorded
    };
    enqueue(
        s,
        Box::new(move || {
            let mut st = state();
            let e = st.events.get_mut(&ev).expect("events are never removed");
            e.fired = e.fired.max(generation);
            Ok(())
        }),
        "cuEventRecord",
    )
}

/// Runs the event's stream until its latest record (at the time of the call) has fired.
fn wait_for(ev: u64, generation: u64, s: u64) {
    run_until(s, &|st| st.events[&ev].fired >= generation);
}

pub(super) fn event_synchronize(ev: u64) -> Result<()> {
    let (generation, s) = {
        let mut st = state();
        let e = live_event(&mut st, ev, "cuEventSynchronize")?;
        (e.recorded, e.stream)
    };
    wait_for(ev, generation, s);
    Ok(())
}

pub(super) fn stream_wait_event(s: u64, ev: u64) -> Result<()> {
    let (generation, from) = {
        let mut st = state();
        let e = live_event(&mut st, ev, "cuStreamWaitEvent")?;
        (e.recorded, e.stream)
    };
    enqueue(
        s,
        Box::new(move || {
            wait_for(ev, generation, from);
            Ok(())
        }),
        "cuStreamWaitEvent",
    )
}

/// Destroys `ev`; waits already queued on it still resolve.
pub(super) fn event_destroy(ev: u64) -> Result<()> {
    let mut st = state();
    live_event(&mut st, ev, "cuEventDestroy")?.live = false;
    Ok(())
}
