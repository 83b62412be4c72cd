//! Lowering strided box copies to the kernels' job tables (pure host code, no driver calls).
//!
//! A [`RawCopy`] is one strided box copy, gather or scatter in C order. [`to_launches`] drops unit
//! dims, collapses dims that are contiguous on both sides, widens the word where the
//! innermost run is contiguous and aligned (so a 4-byte copy moves 16-byte words), folds dims
//! beyond [`MAX_DIMS`] and splits jobs so that every job has fewer than 2^31 elements (the
//! kernels' index arithmetic is 32-bit). The result is one job table per kernel launch.

use crate::error::{Error, Result};

/// Mirrors `DLP_MAX_DIMS`, `DLP_BLOCK`, `DLP_UNROLL` and `DLP_NO_AXIS` in kernels/common.cuh.
pub const MAX_DIMS: usize = 6;
pub const BLOCK: u32 = 256;
pub const UNROLL: u32 = 4;
pub const TILE: u32 = BLOCK * UNROLL;
pub const NO_AXIS: u32 = u32::MAX;
/// Largest element count of one job: indices must stay below 2^31 for the magic division.
pub const MAX_JOB_NUMEL: u64 = (1 << 31) - 1;
/// Largest tile count of one launch (`tile_start` is a u32 in the job table).
const MAX_LAUNCH_TILES: u64 = 1 << 31;

/// The word sizes the kernels are stamped for.
pub const WORDS: [usize; 5] = [1, 2, 4, 8, 16];

/// Which kernel family moves the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Box,
    /// The source coordinate along `axis` is `index[c]`.
    Gather,
    /// The destination coordinate along `axis` is `index[c]`.
    Scatter,
}

/// `DlpJob` of kernels/common.cuh, field for field. Dims are stored innermost first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaJob {
    pub src: u64,
    pub dst: u64,
    pub index: u64,
    pub index_len: i64,
    pub tile_start: u32,
    pub numel: u32,
    pub ndim: u32,
    pub axis: u32,
    pub size: [u32; MAX_DIMS],
    pub magic: [u32; MAX_DIMS],
    pub shift: [u32; MAX_DIMS],
    pub src_stride: [i64; MAX_DIMS],
    pub dst_stride: [i64; MAX_DIMS],
}

const _: () = assert!(std::mem::size_of::<CudaJob>() == 216);

impl CudaJob {
    /// The job as the kernels read it: the `repr(C)` fields in order, little-endian, no
    /// padding (the layout has none).
    pub fn to_bytes(self) -> Vec<u8> {
        let mut b = Vec::with_capacity(std::mem::size_of::<CudaJob>());
        for x in [self.src, self.dst, self.index] {
            b.extend(x.to_le_bytes());
        }
        b.extend(self.index_len.to_le_bytes());
        for x in [self.tile_start, self.numel, self.ndim, self.axis] {
            b.extend(x.to_le_bytes());
        }
        for a in [&self.size, &self.magic, &self.shift] {
            a.iter().for_each(|x| b.extend(x.to_le_bytes()));
        }
        for a in [&self.src_stride, &self.dst_stride] {
            a.iter().for_each(|x| b.extend(x.to_le_bytes()));
        }
        b
    }
}

/// One box copy (or gather or scatter) in raw device addresses: `shape` elements of `item` bytes, strides in elements, C order.
#[derive(Clone, Debug, PartialEq)]
pub struct RawCopy {
    pub src: u64,
    pub dst: u64,
    pub item: usize,
    pub shape: Vec<usize>,
    pub src_strides: Vec<isize>,
    pub dst_strides: Vec<isize>,
    /// Gather/scatter: the dim whose coordinate goes through `index` (contiguous int64).
    pub axis: Option<usize>,
    pub index: u64,
    /// Extent of the indexed side along `axis`: valid indices are `[0, index_len)`.
    pub index_len: usize,
}

/// One kernel launch: `jobs` for the `mode` kernel of word size `word`.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub mode: Mode,
    pub word: usize,
    pub jobs: Vec<CudaJob>,
    pub ntiles: u32,
}

/// `(magic, shift)` with `n / d == (umulhi(n, magic) + n) >> shift` for `n < 2^31`.
pub fn magic_divider(d: u32) -> (u32, u32) {
    assert!(
        d >= 1 && u64::from(d) <= MAX_JOB_NUMEL,
        "divisor {d} out of range"
    );
    let shift = 32 - (d - 1).leading_zeros(); // ceil(log2 d); 0 for d == 1
    let magic = ((1u64 << 32) * ((1u64 << shift) - u64::from(d))) / u64::from(d) + 1;
    (
        u32::try_from(magic).expect("magic fits u32 for d < 2^31"),
        shift,
    )
}

/// The quotient the kernels compute from a [`magic_divider`].
#[cfg(test)]
pub fn magic_div(n: u32, magic: u32, shift: u32) -> u32 {
    let hi = ((u64::from(n) * u64::from(magic)) >> 32) as u32;
    (hi + n) >> shift
}

/// A raw copy in working form: dims in C order as (size, src stride, dst stride), strides
/// in words of `word` bytes.
#[derive(Clone, Debug)]
struct Work {
    src: u64,
    dst: u64,
    index: u64,
    index_len: i64,
    word: usize,
    dims: Vec<(usize, i64, i64)>,
    axis: Option<usize>,
}

impl Work {
    /// Moves the origin to coordinate `c` along dim `d` (the dim itself is kept).
    fn shift_origin(&mut self, mode: Mode, d: usize, c: usize) {
        let (_, ss, ds) = self.dims[d];
        let w = self.word as i64;
        let c = c as i64;
        if self.axis == Some(d) {
            self.index = self.index.wrapping_add((c * 8) as u64);
            match mode {
                Mode::Gather => self.dst = self.dst.wrapping_add((c * ds * w) as u64),
                Mode::Scatter => self.src = self.src.wrapping_add((c * ss * w) as u64),
                Mode::Box => unreachable!("box copies have no axis"),
            }
        } else {
            self.src = self.src.wrapping_add((c * ss * w) as u64);
            self.dst = self.dst.wrapping_add((c * ds * w) as u64);
        }
    }

    /// The sub-copy at coordinate `c` of dim `d`: the dim goes away, unless it is the axis
    /// (whose offset lives on the device) which stays with size 1.
    fn fold(&self, mode: Mode, d: usize, c: usize) -> Work {
        let mut w = self.clone();
        w.shift_origin(mode, d, c);
        if w.axis == Some(d) {
            w.dims[d].0 = 1;
        } else {
            w.dims.remove(d);
            w.axis = w.axis.map(|a| if a > d { a - 1 } else { a });
        }
        w
    }

    fn numel(&self) -> u64 {
        self.dims.iter().map(|d| d.0 as u64).product()
    }
}

fn lower(t: &RawCopy) -> Option<Work> {
    if t.shape.contains(&0) {
        return None;
    }
    // Words must be naturally aligned, and a foreign tensor may start anywhere: an 8-byte
    // element at a 4-byte boundary moves as two 4-byte words (an extra innermost dim).
    let word = [16usize, 8, 4, 2, 1]
        .into_iter()
        .find(|&v| t.item % v == 0 && t.src % v as u64 == 0 && t.dst % v as u64 == 0)
        .expect("1 divides everything");
    let r = (t.item / word) as i64;
    let mut raw: Vec<(usize, i64, i64, bool)> = (0..t.shape.len())
        .map(|d| {
            let (ss, ds) = (t.src_strides[d] as i64, t.dst_strides[d] as i64);
            (t.shape[d], ss * r, ds * r, t.axis == Some(d))
        })
        .collect();
    if r > 1 {
        raw.push((r as usize, 1, 1, false));
    }
    let mut dims: Vec<(usize, i64, i64)> = Vec::new();
    let mut axis = None;
    for (n, ss, ds, is_axis) in raw {
        if n == 1 && !is_axis {
            continue;
        }
        let dim = (n, ss, ds);
        let mergeable = !is_axis && axis != Some(dims.len().wrapping_sub(1));
        match dims.last_mut() {
            Some((n, ss, ds))
                if mergeable && *ss == dim.1 * dim.0 as i64 && *ds == dim.2 * dim.0 as i64 =>
            {
                *n *= dim.0;
                *ss = dim.1;
                *ds = dim.2;
            }
            _ => {
                if is_axis {
                    axis = Some(dims.len());
                }
                dims.push(dim);
            }
        }
    }
    if dims.is_empty() {
        dims.push((1, 0, 0));
    }
    let mut w = Work {
        src: t.src,
        dst: t.dst,
        index: t.index,
        index_len: t.index_len as i64,
        word,
        dims,
        axis,
    };
    widen(&mut w);
    Some(w)
}

/// Moves the innermost run in the widest word that divides its length, both origins and
/// every other stride, when it is contiguous on both sides.
fn widen(w: &mut Work) {
    let last = w.dims.len() - 1;
    let (n, ss, ds) = w.dims[last];
    if w.axis == Some(last) || ss != 1 || ds != 1 {
        return;
    }
    let item = w.word as i64;
    let run = n as i64 * item;
    let fits = |v: i64| {
        run % v == 0
            && w.src % v as u64 == 0
            && w.dst % v as u64 == 0
            && w.dims[..last]
                .iter()
                .all(|&(_, s, d)| (s * item) % v == 0 && (d * item) % v == 0)
    };
    let Some(v) = [16i64, 8, 4, 2].into_iter().find(|&v| v > item && fits(v)) else {
        return;
    };
    let ratio = v / item;
    for d in &mut w.dims[..last] {
        d.1 /= ratio;
        d.2 /= ratio;
    }
    w.dims[last].0 = (run / v) as usize;
    w.word = v as usize;
}

/// Splits `w` into pieces of at most `MAX_DIMS` dims and `max_numel` elements each.
fn split(w: Work, mode: Mode, max_numel: u64, out: &mut Vec<Work>) {
    if w.dims.len() > MAX_DIMS {
        // Fold the outermost dim that is not the axis (the axis must stay on the device).
        let d = (0..w.dims.len())
            .find(|&d| w.axis != Some(d))
            .expect("one axis at most");
        for c in 0..w.dims[d].0 {
            split(w.fold(mode, d, c), mode, max_numel, out);
        }
        return;
    }
    if w.numel() <= max_numel {
        out.push(w);
        return;
    }
    // d: the outermost dim that cannot be taken whole. Dims outside it are folded away
    // first; then d is cut into chunks that fit.
    let mut inner = 1u64;
    let mut d = w.dims.len() - 1;
    while inner * w.dims[d].0 as u64 <= max_numel {
        inner *= w.dims[d].0 as u64;
        d -= 1;
    }
    if let Some(o) = (0..d).find(|&o| w.dims[o].0 > 1) {
        for c in 0..w.dims[o].0 {
            split(w.fold(mode, o, c), mode, max_numel, out);
        }
        return;
    }
    let chunk = (max_numel / inner) as usize;
    let n = w.dims[d].0;
    for start in (0..n).step_by(chunk) {
        let mut piece = w.clone();
        piece.shift_origin(mode, d, start);
        piece.dims[d].0 = chunk.min(n - start);
        out.push(piece);
    }
}

fn encode(w: &Work, tile_start: u32) -> CudaJob {
    let nd = w.dims.len();
    let mut job = CudaJob {
        src: w.src,
        dst: w.dst,
        index: w.index,
        index_len: w.index_len,
        tile_start,
        numel: w.numel() as u32,
        ndim: nd as u32,
        axis: w.axis.map_or(NO_AXIS, |a| (nd - 1 - a) as u32),
        size: [1; MAX_DIMS],
        magic: [1; MAX_DIMS],
        ..CudaJob::default()
    };
    for (k, &(n, ss, ds)) in w.dims.iter().rev().enumerate() {
        let (magic, shift) = magic_divider(n as u32);
        job.size[k] = n as u32;
        job.magic[k] = magic;
        job.shift[k] = shift;
        job.src_stride[k] = ss;
        job.dst_stride[k] = ds;
    }
    job
}

/// Lowers `copies` to launches, one or more per word size. `max_numel` is
/// [`MAX_JOB_NUMEL`] except in tests that exercise splitting.
pub fn to_launches(copies: &[RawCopy], mode: Mode, max_numel: u64) -> Result<Vec<Launch>> {
    let max_numel = max_numel.min(MAX_JOB_NUMEL);
    let mut pieces = Vec::new();
    for t in copies {
        if !WORDS.contains(&t.item) {
            return Err(Error::Backend {
                backend: "cuda",
                op: "copy".into(),
                message: format!(
                    "item size {} bytes has no kernel (sizes: 1, 2, 4, 8, 16)",
                    t.item
                ),
            });
        }
        if (mode == Mode::Box) != t.axis.is_none() {
            return Err(Error::shape(
                format!("{mode:?} transfer axis"),
                format!("{:?}", t.axis),
            ));
        }
        if let Some(w) = lower(t) {
            split(w, mode, max_numel, &mut pieces);
        }
    }
    let mut launches: Vec<Launch> = Vec::new();
    for word in WORDS {
        let mut current: Option<Launch> = None;
        for w in pieces.iter().filter(|w| w.word == word) {
            let tiles = w.numel().div_ceil(u64::from(TILE));
            let full = current
                .as_ref()
                .is_some_and(|l| u64::from(l.ntiles) + tiles > MAX_LAUNCH_TILES);
            if full {
                launches.extend(current.take());
            }
            let l = current.get_or_insert_with(|| Launch {
                mode,
                word,
                jobs: Vec::new(),
                ntiles: 0,
            });
            l.jobs.push(encode(w, l.ntiles));
            l.ntiles += tiles as u32;
        }
        launches.extend(current);
    }
    Ok(launches)
}

#[cfg(test)]
#[path = "jobs_tests.rs"]
mod tests;
