//! The small collective that comes before every exchange of data: each rank tells the others
//! whether it got this far and what it planned, so that all go on or all fail with one error.

use crate::error::{Error, Result};

use super::wire::{Reader, Writer};
use super::Communicator;

/// Every rank's host address and process id, by rank.
#[derive(Clone, Debug)]
pub(crate) struct Peers {
    pub hosts: Vec<String>,
    pub pids: Vec<i64>,
    /// Each rank's note (see [`agree`]).
    pub notes: Vec<String>,
}

/// Writes this rank's outcome: `Ok(fingerprint)` or the error it had.
pub(crate) fn write_outcome(w: &mut Writer, outcome: std::result::Result<u64, &Error>) {
    match outcome {
        Ok(fp) => w.u8(1).u64(fp),
        // A rank's own failure travels as its message alone (the receivers name the rank).
        Err(Error::Collective { kind, message, .. }) => w.u8(0).str(kind).str(message),
        Err(e) => w.u8(0).str(e.kind()).str(&e.to_string()),
    };
}

/// Reads a rank's outcome back: `Ok(fingerprint)` or `(kind, message)`.
pub(crate) fn read_outcome(
    r: &mut Reader<'_>,
) -> Result<std::result::Result<u64, (String, String)>> {
    Ok(match r.u8()? {
        1 => Ok(r.u64()?),
        _ => Err((r.str()?, r.str()?)),
    })
}

/// The error every rank returns when `failed` (rank, kind, message; lowest rank first) is not
/// empty: the lowest rank's, with a count of the others.
pub(crate) fn collective_error(failed: &[(usize, String, String)]) -> Option<Error> {
    let (rank, kind, message) = failed.first()?;
    let mut message = message.clone();
    if failed.len() > 1 {
        let others: Vec<String> = failed[1..].iter().map(|f| f.0.to_string()).collect();
        message.push_str(&format!(" (ranks {} failed too)", others.join(", ")));
    }
    Some(Error::Collective {
        rank: *rank,
        kind: kind.clone(),
        message,
    })
}

/// dlpart's version, which heads every rank's part of a collective's all-gather: ranks
/// running different versions are told so, rather than misreading each other's bytes.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The call a rank failing before its part of a collective names ([`fail_together`]): it joins
/// whatever call the others make.
const ANY_CALL: &str = "";

/// A rank's part of a collective's all-gather, headed by dlpart's version and `call`, the
/// collective this rank makes (`repartition`, `gather`, ...).
pub(crate) fn header(call: &str) -> Writer {
    let mut w = Writer::default();
    w.str(VERSION).str(call);
    w
}

/// Every rank's `bytes` (the [`Communicator::all_gather`] of a collective), checked to hold
/// one part per rank: a communicator that returns another count is an error, not a panic
/// or a misread. The call runs with this thread's claims scopes set aside
/// ([`crate::access::suspend`]), as do the other communicator calls that can come while a
/// scope is held and run a program's code on this thread: `host` (in [`agree`]) and the
/// all-to-alls (`Segments::exchange`). `rank`, `size` and `accepts_device` are called under
/// the scopes: the first two only report the communicator's place, and `accepts_device` is
/// asked only about a device that is not host memory, where every source and target of an
/// exchange then lives, so that its scope claims no memory (a gather holds none).
pub(crate) fn gathered(comm: &dyn Communicator, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    let all = {
        let _aside = crate::access::suspend();
        comm.all_gather(bytes)?
    };
    if all.len() != comm.size() || all.is_empty() {
        return Err(Error::shape(
            format!(
                "an all-gather of one part from each of the {} ranks",
                comm.size()
            ),
            format!("{} parts", all.len()),
        ));
    }
    Ok(all)
}

/// Readers of every rank's part of an all-gather past its header, once the ranks are found to
/// run one dlpart version and make one call (a rank failing alone joins any call): otherwise
/// the same error on every rank, naming two ranks and what differs.
pub(crate) fn read_headers(all: &[Vec<u8>]) -> Result<Vec<Reader<'_>>> {
    let mut readers = Vec::with_capacity(all.len());
    let mut heads = Vec::with_capacity(all.len());
    for (rank, bytes) in all.iter().enumerate() {
        let mut r = Reader::new(bytes, rank);
        heads.push((r.str()?, r.str()?));
        readers.push(r);
    }
    let differ = |found: String| Error::protocol("spmd", None, found, None);
    let (v0, _) = &heads[0];
    if let Some((r, (v, _))) = heads.iter().enumerate().find(|(_, (v, _))| v != v0) {
        return Err(differ(format!(
            "rank 0 runs dlpart {v0}, rank {r} dlpart {v}: every rank must run the same version"
        )));
    }
    let mut named = heads.iter().enumerate().filter(|(_, (_, c))| c != ANY_CALL);
    if let Some((r0, (_, c0))) = named.next() {
        if let Some((r, (_, c))) = named.find(|(_, (_, c))| c != c0) {
            return Err(differ(format!(
                "rank {r0} called {c0}, rank {r} {c}: every rank must make the same \
                 collective calls, in the same order"
            )));
        }
    }
    Ok(readers)
}

/// One all-gather, for the collective `call`, of every rank's `payload` or the error that
/// stopped it before: every rank's payload by rank when every rank had one, else the same
/// error on every rank (the lowest failing rank's).
pub(crate) fn share(
    comm: &dyn Communicator,
    call: &str,
    payload: std::result::Result<&[u8], &Error>,
) -> Result<Vec<Vec<u8>>> {
    let mut w = header(call);
    write_outcome(&mut w, payload.map(|_| 0));
    if let Ok(bytes) = payload {
        w.0.extend_from_slice(bytes);
    }
    let all = gathered(comm, &w.0)?;
    let mut payloads = Vec::with_capacity(all.len());
    let mut failed = Vec::new();
    for (rank, mut r) in read_headers(&all)?.into_iter().enumerate() {
        match read_outcome(&mut r)? {
            Ok(_) => payloads.push(r.rest().to_vec()),
            Err((kind, message)) => failed.push((rank, kind, message)),
        }
    }
    match collective_error(&failed) {
        Some(e) => Err(e),
        None => Ok(payloads),
    }
}

/// One all-gather of every rank's outcome so far (`Ok` with a fingerprint of what it planned,
/// or its error), host and pid. Every rank returns the same: the peers when all succeeded with
/// the same fingerprint; else the lowest failing rank's error, or a `ProtocolError` naming
/// two ranks that planned different `what`s. A `note` travels along, for what ranks may
/// legitimately know or choose differently (a dtype that only the ranks holding data know,
/// an exchange's round size and the device of each rank's side).
pub(crate) fn agree(
    comm: &dyn Communicator,
    call: &str,
    outcome: std::result::Result<u64, &Error>,
    what: &str,
    note: &str,
) -> Result<Peers> {
    let mut w = header(call);
    write_outcome(&mut w, outcome);
    let host = {
        let _aside = crate::access::suspend();
        comm.host()
    };
    w.str(&host).u64(u64::from(std::process::id())).str(note);
    let all = gathered(comm, &w.0)?;
    let mut failed = Vec::new();
    let mut prints = Vec::new();
    let mut peers = Peers {
        hosts: Vec::with_capacity(all.len()),
        pids: Vec::with_capacity(all.len()),
        notes: Vec::with_capacity(all.len()),
    };
    for (rank, mut r) in read_headers(&all)?.into_iter().enumerate() {
        match read_outcome(&mut r)? {
            Ok(fp) => prints.push((rank, fp)),
            Err((kind, message)) => failed.push((rank, kind, message)),
        }
        if call == ANY_CALL {
            // The others' parts are their call's, past the outcome; this rank failed anyway.
            continue;
        }
        peers.hosts.push(r.str()?);
        peers.pids.push(r.u64()? as i64);
        peers.notes.push(r.str()?);
    }
    if let Some(e) = collective_error(&failed) {
        return Err(e);
    }
    if let Some(&(other, _)) = prints.iter().find(|(_, fp)| *fp != prints[0].1) {
        return Err(Error::protocol(
            "spmd",
            None,
            format!(
                "ranks {} and {other} asked for different {what}; every rank must make the same \
                 collective call with the same global arguments",
                prints[0].0
            ),
            None,
        ));
    }
    Ok(peers)
}

/// Takes part in the next collective call of the other ranks with this rank's `error`, so that
/// they fail too instead of waiting: every collective of [`crate::spmd`] starts with the same
/// all-gather of outcomes. Returns the error every rank then has.
pub fn fail_together(comm: &dyn Communicator, error: Error) -> Error {
    match agree(comm, ANY_CALL, Err(&error), "calls", "") {
        Err(e) => e,
        Ok(_) => error,
    }
}

/// One collective call on the verdicts of a check each rank made on its own data (what the
/// others cannot see): `Ok` on every rank when every rank passed, else the lowest failing
/// rank's error on every rank, so that none goes on alone into a call the others never make.
pub fn check_together(comm: &dyn Communicator, outcome: Result<()>) -> Result<()> {
    check_called(comm, "check_together", outcome)
}

/// [`check_together`] in the collective `call` (named to the ranks making another).
pub(crate) fn check_called(comm: &dyn Communicator, call: &str, outcome: Result<()>) -> Result<()> {
    agree(comm, call, outcome.as_ref().map(|()| 0), "checks", "").map(|_| ())
}
