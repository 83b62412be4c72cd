//! The bytes of the small metadata messages the ranks all-gather: little-endian integers and
//! length-prefixed strings, read back with every length checked (a peer's bytes are input).

use crate::device::Device;
use crate::error::{Error, Result};

/// Appends values to a message.
#[derive(Default)]
pub(crate) struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn usize(&mut self, v: usize) -> &mut Self {
        self.u64(v as u64)
    }

    pub fn usizes(&mut self, v: &[usize]) -> &mut Self {
        self.usize(v.len());
        for &x in v {
            self.usize(x);
        }
        self
    }

    pub fn str(&mut self, s: &str) -> &mut Self {
        self.usize(s.len());
        self.0.extend_from_slice(s.as_bytes());
        self
    }

    /// A device by its name (`kDLCUDA:0`), which `Device`'s `FromStr` reads back.
    pub fn device(&mut self, d: Device) -> &mut Self {
        self.str(&d.to_string())
    }

    /// An optional value: a presence flag, then the value (0 when absent).
    pub fn opt_u64(&mut self, v: Option<u64>) -> &mut Self {
        self.u8(u8::from(v.is_some())).u64(v.unwrap_or(0))
    }
}

/// Reads values back from a message of rank `rank`.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    rank: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8], rank: usize) -> Self {
        Reader { bytes, rank }
    }

    /// The rank whose message this is.
    pub fn rank(&self) -> usize {
        self.rank
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(Error::protocol(
                "spmd",
                None,
                format!(
                    "the metadata of rank {} ends early (a different dlpart version?)",
                    self.rank
                ),
                None,
            ));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    pub fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    pub fn usize(&mut self) -> Result<usize> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| {
            Error::protocol(
                "spmd",
                None,
                format!("rank {} sent {v}, beyond this machine's sizes", self.rank),
                None,
            )
        })
    }

    pub fn usizes(&mut self) -> Result<Vec<usize>> {
        let n = self.usize()?;
        // Each value takes 8 bytes: a length beyond what is left is refused before allocating.
        if n > self.bytes.len() / 8 {
            self.take(usize::MAX)?;
        }
        (0..n).map(|_| self.usize()).collect()
    }

    pub fn str(&mut self) -> Result<String> {
        let n = self.usize()?;
        let b = self.take(n)?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.bytes
    }
}

/// FNV-1a over `bytes`: a fingerprint the ranks compare to agree they planned the same thing.
pub(crate) fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
