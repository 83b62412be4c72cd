//! Planning a strided box copy: a few long, simple loops instead of one loop per dimension.
//!
//! A box copy is elementwise and (by contract) writes distinct destination elements, so the
//! dimensions may be visited in any order and walked backwards. Planning drops extent-1 dims,
//! flips dims so that every destination stride is non-negative, orders dims by destination
//! stride (largest first, so writes walk memory forwards), merges dims that are contiguous on
//! both sides, and then picks the kernel for the innermost part ([`Kind`]). The dims left over
//! are the outer loop; each step of it runs `inner_units` units of the kernel. Units are what
//! the scheduler hands to threads, so long rows and big transposes are cut into several.

/// The most dims a plan holds after planning; boxes that need more use the naive copy.
pub(crate) const MAX_DIMS: usize = 12;
/// Longest contiguous row (bytes) copied as one unit.
pub(crate) const ROW_SEG: usize = 128 << 10;
/// Longest strided element run copied as one unit.
pub(crate) const ELEM_SEG: usize = 16 << 10;
/// Side of a transpose tile in bytes: one cache line, so both sides touch whole lines. Two
/// lines were slower (8192^2 f32: 4.2 against 6-7 GB/s here): with power-of-two row strides
/// all rows of a tile fall into the same cache sets, and fewer lines fit their ways.
const TILE_BYTES: usize = 64;
/// Side of a block of tiles in elements (a multiple of every tile side). Each side of a block
/// spans at most this many rows, so a block's pages stay within the TLB, which tiles taken
/// in plain order along one side would thrash.
const TILE_BLOCK: usize = 256;

/// One dimension: extent and byte strides in the source and the destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Dim {
    pub n: usize,
    pub s: isize,
    pub d: isize,
}

/// A position in a list of outer dims, walked in C order: the multi-index and the byte
/// offsets it adds on the source (`s`) and destination (`d`) side.
pub(crate) struct Cursor {
    idx: [usize; MAX_DIMS],
    pub s: isize,
    pub d: isize,
}

impl Cursor {
    /// At flat position `flat` of `outer` (C order), on top of the offsets `(s, d)`.
    #[inline]
    pub fn at(outer: &[Dim], mut flat: usize, mut s: isize, mut d: isize) -> Self {
        let mut idx = [0usize; MAX_DIMS];
        for (j, dim) in outer.iter().enumerate().rev() {
            idx[j] = flat % dim.n;
            flat /= dim.n;
            s += idx[j] as isize * dim.s;
            d += idx[j] as isize * dim.d;
        }
        Cursor { idx, s, d }
    }

    /// Moves to the next position in C order (back to the first after the last).
    #[inline]
    pub fn step(&mut self, outer: &[Dim]) {
        for (j, dim) in outer.iter().enumerate().rev() {
            self.idx[j] += 1;
            self.s += dim.s;
            self.d += dim.d;
            if self.idx[j] < dim.n {
                return;
            }
            self.idx[j] = 0;
            self.s -= dim.n as isize * dim.s;
            self.d -= dim.n as isize * dim.d;
        }
    }
}

/// A short inline list of dims (plans are built per job, so they must not allocate).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    len: usize,
    v: [Dim; MAX_DIMS],
}

impl Dims {
    pub fn new() -> Self {
        Dims {
            len: 0,
            v: [Dim::default(); MAX_DIMS],
        }
    }

    /// Appends `d`; false when full.
    #[must_use]
    pub fn push(&mut self, d: Dim) -> bool {
        if self.len == MAX_DIMS {
            return false;
        }
        self.v[self.len] = d;
        self.len += 1;
        true
    }

    pub fn as_slice(&self) -> &[Dim] {
        &self.v[..self.len]
    }

    fn remove(&mut self, i: usize) -> Dim {
        let d = self.v[i];
        self.v.copy_within(i + 1..self.len, i);
        self.len -= 1;
        d
    }

    /// Product of the extents.
    pub fn count(&self) -> usize {
        self.as_slice().iter().map(|d| d.n).product()
    }

    /// Merges neighbours (outer, inner) that are contiguous on both sides.
    pub fn merge(&mut self) {
        let mut out = 0;
        for i in 0..self.len {
            let cur = self.v[i];
            if out > 0 {
                let prev = self.v[out - 1];
                let n = cur.n as isize;
                if prev.s == cur.s * n && prev.d == cur.d * n {
                    self.v[out - 1] = Dim {
                        n: prev.n * cur.n,
                        ..cur
                    };
                    continue;
                }
            }
            self.v[out] = cur;
            out += 1;
        }
        self.len = out;
    }
}

/// The kernel that runs the innermost part of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A run of `bytes` contiguous on both sides, cut into segments of `seg` bytes.
    Rows { bytes: usize, seg: usize },
    /// Read contiguously along `p`, written contiguously along `q`: square tiles of `t`
    /// elements a side, in square blocks of `block` elements a side (one unit each),
    /// `blocks_q` of them along `q`.
    Tile {
        p: Dim,
        q: Dim,
        t: usize,
        block: usize,
        blocks_q: usize,
    },
    /// A strided run of single elements, cut into segments of `seg` elements.
    Elems { run: Dim, seg: usize },
    /// More dims than a plan holds: one unit, the naive element-by-element copy.
    Naive,
}

/// A planned box copy. Pointers stay outside, so one plan can serve many boxes (gather).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lowered<'a> {
    /// Bytes per element moved by the kernels: 1, 2, 4, 8 or 16.
    pub elem: usize,
    pub outer: Dims,
    pub kind: Kind,
    pub inner_units: usize,
    /// Total units: outer count times `inner_units` (0 for an empty box).
    pub units: usize,
    /// Bytes moved by one full unit, to size the work handed to threads.
    pub unit_bytes: usize,
    /// Total bytes of the box.
    pub bytes: usize,
    /// Byte offsets to add to the source and destination pointers (from flipped dims).
    pub src_off: isize,
    pub dst_off: isize,
    /// Whether no two destination elements share an address (else: never split in threads).
    pub dst_distinct: bool,
    /// The box as given, for [`Kind::Naive`].
    pub orig: Orig<'a>,
}

/// A box as the caller gave it: strides in elements.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Orig<'a> {
    pub shape: &'a [usize],
    pub src_strides: &'a [isize],
    pub dst_strides: &'a [isize],
    pub itemsize: usize,
}

fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// Whether `itemsize` is one the kernels move as a single machine word.
pub(crate) fn is_word(itemsize: usize) -> bool {
    matches!(itemsize, 1 | 2 | 4 | 8 | 16)
}

/// Whether a layout of dims (sorted by destination stride, largest first, all `d >= 0`) writes
/// every element to its own address: each stride must step over everything inside it.
fn distinct(dims: &[Dim], elem: usize) -> bool {
    let mut span = elem as isize;
    for dim in dims.iter().rev() {
        if dim.d < span {
            return false;
        }
        span += (dim.n as isize - 1) * dim.d;
    }
    true
}

/// Whether every element of a box (strides in elements) has its own address. Conservative:
/// layouts with more than [`MAX_DIMS`] dims of extent > 1 count as overlapping.
pub(crate) fn distinct_layout(shape: &[usize], strides: &[isize], itemsize: usize) -> bool {
    let mut dims = Dims::new();
    for (&n, &s) in shape.iter().zip(strides) {
        if n > 1
            && !dims.push(Dim {
                n,
                s: 0,
                d: (s * itemsize as isize).abs(),
            })
        {
            return false;
        }
    }
    let v = &mut dims.v[..dims.len];
    v.sort_unstable_by_key(|dim| std::cmp::Reverse(dim.d));
    distinct(v, itemsize.max(1))
}

impl<'a> Lowered<'a> {
    /// Plans copying the box `orig` (every stride slice as long as `orig.shape`).
    pub fn new(orig: Orig<'a>) -> Lowered<'a> {
        let Orig {
            shape,
            src_strides,
            dst_strides,
            itemsize,
        } = orig;
        debug_assert!(src_strides.len() == shape.len() && dst_strides.len() == shape.len());
        let numel: usize = shape.iter().product();
        let mut plan = Lowered {
            elem: itemsize,
            outer: Dims::new(),
            kind: Kind::Naive,
            inner_units: 1,
            units: 1,
            unit_bytes: numel * itemsize,
            bytes: numel * itemsize,
            src_off: 0,
            dst_off: 0,
            dst_distinct: true,
            orig,
        };
        if numel == 0 || itemsize == 0 {
            plan.units = 0;
            plan.bytes = 0;
            return plan;
        }
        let item = itemsize as isize;
        let mut dims = Dims::new();
        let mut fits = true;
        for ((&n, &s), &d) in shape.iter().zip(src_strides).zip(dst_strides) {
            if n == 1 {
                continue;
            }
            let mut dim = Dim {
                n,
                s: s * item,
                d: d * item,
            };
            if dim.d < 0 {
                let last = n as isize - 1;
                plan.src_off += last * dim.s;
                plan.dst_off += last * dim.d;
                dim.s = -dim.s;
                dim.d = -dim.d;
            }
            fits &= dims.push(dim);
        }
        // An odd item size is a contiguous run of bytes inside each element.
        let elem = if is_word(itemsize) { itemsize } else { 1 };
        if elem != itemsize {
            fits &= dims.push(Dim {
                n: itemsize,
                s: 1,
                d: 1,
            });
        }
        if !fits {
            plan.dst_distinct = false;
            return plan;
        }
        let v = &mut dims.v[..dims.len];
        // Insertion sort (a dozen dims at most): destination stride descending, then |source|.
        for i in 1..v.len() {
            let mut j = i;
            while j > 0 && (v[j].d, v[j].s.abs()) > (v[j - 1].d, v[j - 1].s.abs()) {
                v.swap(j, j - 1);
                j -= 1;
            }
        }
        dims.merge();
        plan.dst_distinct = distinct(dims.as_slice(), elem);
        plan.elem = elem;
        plan.choose_kind(dims);
        plan
    }

    fn choose_kind(&mut self, mut dims: Dims) {
        let mut elem = self.elem;
        let mut row = dims
            .as_slice()
            .iter()
            .position(|d| d.s == elem as isize && d.d == elem as isize);
        // A short row that is a machine word becomes the element, so that a transpose of,
        // say, pairs of f32 still gets tiles.
        if let Some(r) = row {
            let bytes = dims.v[r].n * elem;
            if dims.len > 1 && bytes <= 16 && is_word(bytes) {
                dims.remove(r);
                elem = bytes;
                row = None;
            }
        }
        self.elem = elem;
        let e = elem as isize;
        if let Some(r) = row {
            let bytes = dims.remove(r).n * elem;
            let units = ceil_div(bytes, ROW_SEG);
            let seg = ceil_div(ceil_div(bytes, units), 64) * 64;
            self.kind = Kind::Rows { bytes, seg };
            self.inner_units = ceil_div(bytes, seg);
            self.unit_bytes = seg.min(bytes);
        } else if dims.len == 0 {
            self.kind = Kind::Rows {
                bytes: elem,
                seg: elem,
            };
            self.inner_units = 1;
            self.unit_bytes = elem;
        } else {
            let sl = dims.as_slice();
            let q = sl.iter().rposition(|d| d.d == e);
            let p = sl
                .iter()
                .enumerate()
                .rposition(|(i, d)| d.s == e && Some(i) != q);
            if let (Some(q), Some(p)) = (q, p) {
                let (pd, qd) = (sl[p], sl[q]);
                dims.remove(p.max(q));
                dims.remove(p.min(q));
                let t = (TILE_BYTES / elem).max(1);
                let blocks_q = ceil_div(qd.n, TILE_BLOCK);
                self.kind = Kind::Tile {
                    p: pd,
                    q: qd,
                    t,
                    block: TILE_BLOCK,
                    blocks_q,
                };
                self.inner_units = ceil_div(pd.n, TILE_BLOCK) * blocks_q;
                self.unit_bytes = TILE_BLOCK.min(pd.n) * TILE_BLOCK.min(qd.n) * elem;
            } else {
                let run = dims.remove(dims.len - 1);
                let seg = ELEM_SEG.min(run.n);
                self.kind = Kind::Elems { run, seg };
                self.inner_units = ceil_div(run.n, seg);
                self.unit_bytes = seg * elem;
            }
        }
        self.outer = dims;
        self.units = dims.count() * self.inner_units;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lowered<'a>(shape: &'a [usize], s: &'a [isize], d: &'a [isize], item: usize) -> Lowered<'a> {
        Lowered::new(Orig {
            shape,
            src_strides: s,
            dst_strides: d,
            itemsize: item,
        })
    }

    #[test]
    fn contiguous_boxes_become_one_row() {
        let p = lowered(&[4, 1, 8], &[8, 99, 1], &[8, 5, 1], 4);
        assert_eq!(
            p.kind,
            Kind::Rows {
                bytes: 128,
                seg: 128
            }
        );
        assert_eq!((p.units, p.outer.as_slice().len()), (1, 0));
        let big = lowered(&[1 << 20], &[1], &[1], 4);
        assert_eq!(big.units, 32);
        assert_eq!(big.unit_bytes, ROW_SEG);
    }

    #[test]
    fn column_blocks_are_rows_of_the_block_width() {
        // A 2048x2048 block of an 8192-wide source into a 2048-wide destination.
        let p = lowered(&[2048, 2048], &[8192, 1], &[2048, 1], 4);
        assert_eq!(
            p.kind,
            Kind::Rows {
                bytes: 8192,
                seg: 8192
            }
        );
        assert_eq!(
            p.outer.as_slice(),
            &[Dim {
                n: 2048,
                s: 32768,
                d: 8192
            }]
        );
    }

    #[test]
    fn transposes_get_tiles_and_reversals_get_offsets() {
        let p = lowered(&[64, 32], &[1, 64], &[32, 1], 4);
        assert!(
            matches!(
                p.kind,
                Kind::Tile {
                    t: 16,
                    blocks_q: 1,
                    ..
                }
            ),
            "{p:?}"
        );
        assert_eq!(p.units, 1);
        let big = lowered(&[600, 300], &[1, 600], &[300, 1], 2);
        assert!(
            matches!(
                big.kind,
                Kind::Tile {
                    t: 32,
                    blocks_q: 2,
                    ..
                }
            ),
            "{big:?}"
        );
        assert_eq!(big.units, 6);
        let r = lowered(&[5], &[1], &[-1], 8);
        assert_eq!(
            r.kind,
            Kind::Elems {
                run: Dim { n: 5, s: -8, d: 8 },
                seg: 5
            }
        );
        assert_eq!((r.src_off, r.dst_off), (32, -32));
        // Pairs of f32 transposed: the pair becomes a 8-byte element.
        let pairs = lowered(&[16, 16, 2], &[2, 32, 1], &[32, 2, 1], 4);
        assert_eq!(pairs.elem, 8);
        assert!(matches!(pairs.kind, Kind::Tile { .. }), "{pairs:?}");
    }

    #[test]
    fn odd_item_sizes_and_overlapping_destinations() {
        let p = lowered(&[3, 4], &[8, 2], &[4, 1], 3);
        assert_eq!((p.elem, p.kind), (1, Kind::Rows { bytes: 3, seg: 64 }));
        assert_eq!(p.units, 12);
        assert!(!lowered(&[3, 4], &[4, 1], &[0, 1], 4).dst_distinct);
        assert!(!lowered(&[3, 4], &[4, 1], &[2, 1], 4).dst_distinct);
        assert!(lowered(&[3, 4], &[4, 1], &[-4, 1], 4).dst_distinct);
        assert_eq!(lowered(&[3, 0], &[4, 1], &[4, 1], 4).units, 0);
        let many = [2usize; 13];
        let s: Vec<isize> = (0..13).map(|i| 1 << (2 * i)).collect();
        assert_eq!(lowered(&many, &s, &s, 4).kind, Kind::Naive);
    }
}
