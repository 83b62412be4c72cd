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

/// One all-gather of every rank's outcome so far (`Ok` with a fingerprint of what it planned,
/// or its error), host and pid. Every rank returns the same: the peers when all succeeded with
/// the same fingerprint; else the lowest failing rank's error, or a `ProtocolError` naming
/// two ranks that planned different `what`s. A `note` travels along, for what ranks may
/// legitimately know differently (a dtype that only the ranks holding data know).
pub(crate) fn agree(
    comm: &dyn Communicator,
    outcome: std::result::Result<u64, &Error>,
    what: &str,
    note: &str,
) -> Result<Peers> {
    let mut w = Writer::default();
    write_outcome(&mut w, outcome);
    w.str(&comm.host())
        .u64(u64::from(std::process::id()))
        .str(note);
    let all = comm.all_gather(&w.0)?;
    let mut failed = Vec::new();
    let mut prints = Vec::new();
    let mut peers = Peers {
        hosts: Vec::with_capacity(all.len()),
        pids: Vec::with_capacity(all.len()),
        notes: Vec::with_capacity(all.len()),
    };
    for (rank, bytes) in all.iter().enumerate() {
        let mut r = Reader::new(bytes, rank);
        match read_outcome(&mut r)? {
            Ok(fp) => prints.push((rank, fp)),
            Err((kind, message)) => failed.push((rank, kind, message)),
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
    match agree(comm, Err(&error), "calls", "") {
        Err(e) => e,
        Ok(_) => error,
    }
}

/// One collective call on the verdicts of a check each rank made on its own data (what the
/// others cannot see): `Ok` on every rank when every rank passed, else the lowest failing
/// rank's error on every rank, so that none goes on alone into a call the others never make.
pub fn check_together(comm: &dyn Communicator, outcome: Result<()>) -> Result<()> {
    agree(comm, outcome.as_ref().map(|()| 0), "checks", "").map(|_| ())
}
