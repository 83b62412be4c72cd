//! The point-to-point messages by which dlpart's MPI communicators carry an all-to-all-v
//! (`dlpart.mpi` over mpi4py, and `MpiComm` over rsmpi): messages only between the
//! ranks with bytes for each other, each peer's segment cut into messages of at most
//! [`MessageBytes`], the same way by the rank that sends it and the rank that receives it.

use std::sync::LazyLock;

use crate::error::{Error, Result};

use super::Segments;

/// This rank's own `DLPART_MPI_MESSAGE_BYTES` (read once, at least 1; 1 GiB by default, never
/// more than `i32::MAX`): what it offers when a communicator agrees on its [`MessageBytes`].
/// Never a cut by itself: the variable may be set differently on the ranks.
static OWN_MESSAGE_BYTES: LazyLock<usize> = LazyLock::new(|| {
    let set = std::env::var("DLPART_MPI_MESSAGE_BYTES").ok();
    message_bytes(set.as_deref())
});

fn message_bytes(set: Option<&str>) -> usize {
    set.and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1 << 30)
        .min(i32::MAX as usize)
}

/// The most bytes one message carries, agreed by every rank of one communicator: MPI counts
/// are C ints, so a peer's segment beyond this travels as several messages (1 GiB by default;
/// `DLPART_MPI_MESSAGE_BYTES` sets it, for tests). A rank's receives must be cut as its peers'
/// sends are, and the variable may be set differently on the ranks, so the only way to get a
/// `MessageBytes` is [`MessageBytes::agree`]: rank 0's value, which a collective call hands to
/// every rank once, when the communicator is made. [`messages`] cuts by nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MessageBytes(usize);

impl MessageBytes {
    /// Rank 0's `DLPART_MPI_MESSAGE_BYTES` on every rank: `from_root` is a collective call of
    /// the communicator that hands rank 0's value to every rank (a broadcast from rank 0, or an
    /// all-gather that also carries what else the ranks agree on; every rank calls it once, at
    /// the same point), given this rank's own value and returning rank 0's. A value out of
    /// range (0, or beyond `i32::MAX`) is brought into it the same way on every rank.
    pub fn agree(from_root: impl FnOnce(u64) -> Result<u64>) -> Result<MessageBytes> {
        let root = from_root(*OWN_MESSAGE_BYTES as u64)?;
        Ok(MessageBytes(
            usize::try_from(root).map_or(i32::MAX as usize, |n| n.clamp(1, i32::MAX as usize)),
        ))
    }

    /// The bytes.
    pub fn get(self) -> usize {
        self.0
    }
}

/// The tag of dlpart's messages, on the communicator's duplicate that dlpart makes for itself
/// (so that they never meet the program's own receives).
pub(crate) const TAG: i32 = 0x646c;

/// One message of an exchange: sent to or received from `peer`, `len` bytes at `at` in the
/// send or the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Message {
    /// A send (`Isend`), else a receive (`Irecv`).
    pub send: bool,
    /// The other rank.
    pub peer: usize,
    /// Where the bytes start in the buffer.
    pub at: usize,
    /// How many (at least 1).
    pub len: usize,
}

impl Message {
    /// `Isend` or `Irecv`.
    pub fn op(&self) -> &'static str {
        if self.send {
            "Isend"
        } else {
            "Irecv"
        }
    }
}

/// Rank `me`'s messages for `segments`, of at most `max` bytes each, in the order to post
/// them: every receive first (so that every message finds its receive), then the sends.
/// After `me`'s own segment (empty in dlpart's plans), receives go to the ranks below it
/// first and sends to the ranks above it first, so the ranks do not all start with the same
/// peer. Every rank cuts its segments with the same `max` (agreed: see [`MessageBytes`]), and
/// MPI's messages between two ranks with one tag do not overtake, so each receive meets the
/// send of the same bytes.
/// A nonempty segment outside its buffer (`send_len` or `recv_len` bytes) is an error.
pub(crate) fn messages(
    me: usize,
    segments: &Segments<'_>,
    send_len: usize,
    recv_len: usize,
    max: MessageBytes,
) -> Result<Vec<Message>> {
    let max = max.get();
    let n = segments.send_counts.len();
    let mut out = Vec::new();
    for send in [false, true] {
        let (counts, displs, len) = match send {
            false => (segments.recv_counts, segments.recv_displs, recv_len),
            true => (segments.send_counts, segments.send_displs, send_len),
        };
        for k in 0..n {
            let peer = if send { (me + k) % n } else { (me + n - k) % n };
            let (displ, count) = (displs[peer], counts[peer]);
            if count > 0 && displ.checked_add(count).is_none_or(|end| end > len) {
                return Err(Error::buffer(format!(
                    "rank {me}: segment {peer} lies outside the exchange's buffers"
                )));
            }
            out.extend((0..count.div_ceil(max)).map(|i| Message {
                send,
                peer,
                at: displ + i * max,
                len: max.min(count - i * max),
            }));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segments<'a>(
        send: (&'a [usize], &'a [usize]),
        recv: (&'a [usize], &'a [usize]),
    ) -> Segments<'a> {
        Segments {
            send_counts: send.0,
            send_displs: send.1,
            recv_counts: recv.0,
            recv_displs: recv.1,
        }
    }

    /// The cut rank 0 hands every rank: `n`.
    fn cut(n: usize) -> MessageBytes {
        MessageBytes::agree(|_| Ok(n as u64)).unwrap()
    }

    fn m(send: bool, peer: usize, at: usize, len: usize) -> Message {
        Message {
            send,
            peer,
            at,
            len,
        }
    }

    #[test]
    fn segments_are_cut_the_same_way_and_empty_ones_send_nothing() {
        // Rank 1 of 4: receives 7 bytes from rank 0 and 3 from rank 3; sends 10 to rank 3
        // and 2 to rank 0 (rank 2 and itself: nothing).
        let s = segments(
            (&[2, 0, 0, 10], &[10, 0, 0, 0]),
            (&[7, 0, 0, 3], &[0, 7, 7, 7]),
        );
        let got = messages(1, &s, 12, 10, cut(3)).unwrap();
        let want = vec![
            // Receives: from rank 0 first (the rank below), then 3.
            m(false, 0, 0, 3),
            m(false, 0, 3, 3),
            m(false, 0, 6, 1),
            m(false, 3, 7, 3),
            // Sends: to rank 3 before rank 0 (the ranks above first, wrapping).
            m(true, 3, 0, 3),
            m(true, 3, 3, 3),
            m(true, 3, 6, 3),
            m(true, 3, 9, 1),
            m(true, 0, 10, 2),
        ];
        assert_eq!(got, want);
        // Every segment's messages cover it exactly, whatever the cut.
        for max in 1..12 {
            let got = messages(1, &s, 12, 10, cut(max)).unwrap();
            for (send, counts, displs) in [
                (true, [2, 0, 0, 10], [10, 0, 0, 0]),
                (false, [7, 0, 0, 3], [0, 7, 7, 7]),
            ] {
                for p in 0..4 {
                    let mut bytes: Vec<usize> = got
                        .iter()
                        .filter(|x| x.send == send && x.peer == p)
                        .flat_map(|x| {
                            assert!(x.len >= 1 && x.len <= max);
                            x.at..x.at + x.len
                        })
                        .collect();
                    bytes.sort_unstable();
                    let want: Vec<usize> = (displs[p]..displs[p] + counts[p]).collect();
                    assert_eq!(bytes, want, "max {max}, peer {p}");
                }
            }
        }
    }

    #[test]
    fn a_segment_outside_its_buffer_is_an_error_naming_it() {
        let s = segments((&[0, 4], &[0, 0]), (&[0, 5], &[0, 6]));
        let e = messages(0, &s, 4, 10, cut(8)).unwrap_err().to_string();
        assert!(
            e.contains("rank 0: segment 1 lies outside the exchange's buffers"),
            "{e}"
        );
        // Empty segments may point anywhere; an end past usize is outside too.
        let s = segments((&[0, 0], &[99, 99]), (&[0, 1], &[0, usize::MAX]));
        assert!(messages(0, &s, 0, 10, cut(8)).is_err());
        assert!(messages(
            0,
            &segments((&[0, 0], &[99, 99]), (&[0, 0], &[5, 5])),
            0,
            0,
            cut(8)
        )
        .is_ok());
    }

    #[test]
    fn the_message_size_is_read_from_the_environment_within_mpi_s_int_counts() {
        assert_eq!(message_bytes(None), 1 << 30);
        assert_eq!(message_bytes(Some(" 203 ")), 203);
        assert_eq!(message_bytes(Some("0")), 1 << 30);
        assert_eq!(message_bytes(Some("lots")), 1 << 30);
        assert_eq!(message_bytes(Some("99999999999")), i32::MAX as usize);
    }

    #[test]
    fn the_message_size_is_rank_0_s_offered_by_each_rank_within_mpi_s_int_counts() {
        // Each rank offers its own value; what comes back from the broadcast is the cut.
        let mut offered = None;
        let got = MessageBytes::agree(|mine| {
            offered = Some(mine);
            Ok(203)
        });
        assert_eq!(got.unwrap().get(), 203);
        assert_eq!(offered, Some(*OWN_MESSAGE_BYTES as u64));
        assert_eq!(cut(0).get(), 1);
        assert_eq!(
            MessageBytes::agree(|_| Ok(u64::MAX)).unwrap().get(),
            i32::MAX as usize
        );
        // A failed broadcast is the agreement's error.
        let e = MessageBytes::agree(|_| Err(Error::buffer("bcast of 8 bytes failed")));
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("bcast of 8 bytes failed"));
    }
}
