//! The copies of a whole repartition [`Plan`] in one call ([`Backend::copy_plan`] on the CPU).
//!
//! A repartition of a fine grid is thousands of tiny boxes, so what each box costs beside its
//! bytes decides the time. On a 512² float32 array over 64x64 partitions shifted by half a
//! block (16,129 boxes of at most 4x4 elements) the call took 6-10 ms here through
//! [`Backend::copy_boxes`], most of it per box: three `Vec`s cloned per box (malloc and free
//! were about 20% of a profile), bounds checks, and a kernel plan per box (9%). Here the
//! tensors are checked once each against the grids (so every box of the plan is in bounds by
//! construction), and each box becomes a descriptor written into one per-call buffer:
//! - boxes whose rows are contiguous on both sides, at most two outer dims and under
//!   [`GROUP_MIN_BYTES`], become a [`RowBox`] run by a plain loop of row copies;
//! - other boxes (transposes, more dims, big boxes the scheduler splits or groups) go to
//!   [`copy_boxes_tuned`] as [`RawCopy`]s, planned there as before;
//! - a box whose source overlaps its own destination (only `repartition_into` with aliased
//!   targets) reads a packed copy of its source, made before any box is written (so that
//!   the one claim covers the whole call and a failed allocation writes nothing), as
//!   [`Backend::copy_boxes`] does.
//!
//! [`Backend::copy_plan`]: crate::backend::Backend::copy_plan
//! [`Backend::copy_boxes`]: crate::backend::Backend::copy_boxes

use super::copy::{copy_boxes_tuned, store_for, RawCopy, Stores, Tuning, GROUP_MIN_BYTES};
use super::nontemporal::{self, copy_lines, copy_row, Store};
use super::{overlap, packed, span, DstView, SrcView};
use crate::access;
use crate::dtype::DType;
use crate::error::{tuple_string, Error, Result};
use crate::grid::{same_shape, Grid};
use crate::plan::{BoxCopy, Plan};
use crate::tensor::Tensor;

/// A box of `n0 x n1` rows of `row` bytes, contiguous on both sides; byte strides `s*` in the
/// source and `d*` in the destination (`n0 = 1` and `n1 = 1` for fewer outer dims).
#[derive(Clone, Copy, Debug)]
struct RowBox {
    src: *const u8,
    dst: *mut u8,
    row: usize,
    n1: usize,
    s1: isize,
    d1: isize,
    n0: usize,
    s0: isize,
    d0: isize,
}

// SAFETY: a descriptor is addresses plus sizes and owns nothing; it is only dereferenced in
// `run_rows`, whose caller guarantees the memory is valid and each box written by one thread.
unsafe impl Send for RowBox {}
// SAFETY: as for `Send`.
unsafe impl Sync for RowBox {}

impl RowBox {
    fn bytes(&self) -> usize {
        self.row * self.n1 * self.n0
    }
}

/// Copies every row of `b`.
///
/// # Safety
/// Every row of the box must be readable from `b.src` and writable from `b.dst`, the two not
/// overlapping, and no other thread may touch the destination meanwhile.
#[inline]
unsafe fn run_rows(b: &RowBox, store: Store) {
    let (mut s0, mut d0) = (b.src, b.dst);
    for _ in 0..b.n0 {
        let (mut s, mut d) = (s0, d0);
        for _ in 0..b.n1 {
            // SAFETY: one row of the box (caller contract).
            unsafe { copy_row(d, s, b.row, store) };
            s = s.wrapping_offset(b.s1);
            d = d.wrapping_offset(b.d1);
        }
        s0 = s0.wrapping_offset(b.s0);
        d0 = d0.wrapping_offset(b.d0);
    }
}

/// Runs `rows` on this thread: in streaming mode by row groups ([`run_grouped`]), else box
/// by box.
///
/// # Safety
/// As for [`run_row_boxes`].
unsafe fn run_piece(rows: &[RowBox], store: Store) {
    if store == Store::Stream {
        // SAFETY: forwarded caller contract.
        unsafe { run_grouped(rows, store) };
    } else {
        for b in rows {
            // SAFETY: forwarded caller contract.
            unsafe { run_rows(b, store) };
        }
    }
}

/// Whether the rows of `next` continue those of `prev` in the source: same row count and
/// stride, first row right after `prev`'s.
#[inline]
fn continues(prev: &RowBox, next: &RowBox) -> bool {
    prev.n0 == 1
        && next.n0 == 1
        && next.n1 == prev.n1
        && next.s1 == prev.s1
        && next.src == prev.src.wrapping_add(prev.row)
}

/// Runs `rows`, taking each run of boxes whose source rows continue one another row by row
/// across the run (a row group), so that the source is read front to back, and storing rows
/// of whole cache lines with streaming stores ([`copy_lines`]). Measured on block_cyclic/b32
/// (65,536 boxes of 32 rows of 128 bytes, 256 MiB), timing this pass inside the call: box
/// by box 63-90 ms, grouped 56-103 ms, box by box with 128-byte rows streamed 68-95 ms,
/// grouped and streamed 29-45 ms (5 calls each, two rounds, this loaded 2-vCPU machine).
/// Under streaming's 2 MiB threshold everything is in cache, and grouping measured neither
/// better nor worse on small_grid/1MiB, so it is used in streaming mode only.
///
/// # Safety
/// As for [`run_row_boxes`].
unsafe fn run_grouped(rows: &[RowBox], store: Store) {
    let mut i = 0;
    while i < rows.len() {
        let mut j = i + 1;
        while j < rows.len() && continues(&rows[j - 1], &rows[j]) {
            j += 1;
        }
        if j - i == 1 {
            // SAFETY: forwarded caller contract.
            unsafe { run_rows(&rows[i], store) };
        } else {
            let group = &rows[i..j];
            for m in 0..group[0].n1 as isize {
                for b in group {
                    // SAFETY: row m < n1 of box b (caller contract).
                    unsafe {
                        copy_lines(
                            b.dst.wrapping_offset(m * b.d1),
                            b.src.wrapping_offset(m * b.s1),
                            b.row,
                            store,
                        )
                    };
                }
            }
        }
        i = j;
    }
}

/// What one box of the plan becomes.
enum Shape {
    Rows(RowBox),
    /// Anything else: planned by the general kernels.
    General,
}

/// Byte offset of the box at `start` in `t`.
#[inline]
fn offset(t: &Tensor, start: &[usize], item: isize) -> isize {
    start
        .iter()
        .zip(t.strides())
        .map(|(&i, &s)| i as isize * s)
        .sum::<isize>()
        * item
}

/// Sorts the box `op` (addresses `src`, `dst`) into a [`RowBox`] where it is one.
#[inline]
fn classify(
    op: &BoxCopy,
    s: &Tensor,
    d: &Tensor,
    src: *const u8,
    dst: *mut u8,
    item: usize,
) -> Shape {
    let (ss, ds) = (s.strides(), d.strides());
    let mut row = item;
    let mut outer = [(1usize, 0isize, 0isize); 2];
    let mut k = 0;
    let mut merging = true;
    for a in (0..op.shape.len()).rev() {
        let n = op.shape[a];
        if n == 1 {
            continue;
        }
        let (sb, db) = (ss[a] * item as isize, ds[a] * item as isize);
        // Innermost dims contiguous on both sides extend the row.
        if merging && sb == row as isize && db == row as isize {
            row *= n;
            continue;
        }
        // A box with no contiguous dim is a transpose or a strided gather: the tile and
        // element kernels do those better than a row loop.
        if row == item || k == 2 {
            return Shape::General;
        }
        merging = false;
        outer[k] = (n, sb, db);
        k += 1;
    }
    // `outer[0]` is the inner of the two outer dims.
    let ((n1, s1, d1), (n0, s0, d0)) = (outer[0], outer[1]);
    let b = RowBox {
        src,
        dst,
        row,
        n1,
        s1,
        d1,
        n0,
        s0,
        d0,
    };
    if b.bytes() >= GROUP_MIN_BYTES {
        Shape::General
    } else {
        Shape::Rows(b)
    }
}

/// Checks one side: one tensor per partition of `grid`, of its shape, host-accessible, one
/// dtype, writable when `write`. Returns the dtype (`None` without tensors).
fn check_side(grid: &Grid, ts: &[&Tensor], what: &str, write: bool) -> Result<Option<DType>> {
    if ts.len() != grid.num_partitions() {
        return Err(Error::shape(
            format!(
                "copy_plan: a grid of tiling {} needs one {what} tensor per partition",
                tuple_string(&grid.tiling())
            ),
            format!("{} tensors", ts.len()),
        ));
    }
    let dtype = ts.first().map(|t| t.dtype());
    let mut bad = None;
    grid.for_each_region(|i, _, shape| {
        let t = ts[i];
        let ok = same_shape(t.shape(), shape)
            && Some(t.dtype()) == dtype
            && t.device().is_host_accessible()
            && !(write && t.readonly());
        if !ok && bad.is_none() {
            bad = Some((i, shape.to_vec()));
        }
    });
    if let Some((i, shape)) = bad {
        let t = ts[i];
        if !t.device().is_host_accessible() {
            return Err(Error::UnsupportedDevice {
                device: t.device().to_string(),
                op: "copy_plan on the CPU backend".into(),
            });
        }
        if write && t.readonly() {
            return Err(Error::ReadOnly {
                what: format!("copy_plan {what} partition {i}"),
            });
        }
        return Err(Error::shape(
            format!(
                "copy_plan: {what} partition {i} must have shape {} and dtype {}",
                tuple_string(&shape),
                dtype.expect("a tensor")
            ),
            format!("{t:?}"),
        ));
    }
    Ok(dtype)
}

/// A general box: addresses, and where its shape lies in the per-call shape buffer.
struct General {
    src: usize,
    dst: usize,
    src_ptr: *const u8,
    dst_ptr: *mut u8,
    shape_at: usize,
}

impl General {
    /// The box `op` from `src_ptr` to `dst_ptr`, its shape appended to `shapes`.
    fn of(op: &BoxCopy, src_ptr: *const u8, dst_ptr: *mut u8, shapes: &mut Vec<usize>) -> Self {
        let shape_at = shapes.len();
        shapes.extend_from_slice(&op.shape);
        General {
            src: op.src,
            dst: op.dst,
            src_ptr,
            dst_ptr,
            shape_at,
        }
    }
}

/// [`Backend::copy_plan`](crate::backend::Backend::copy_plan) on the CPU, with `tuning`.
pub(super) fn copy_plan(
    plan: &Plan,
    src: &[&Tensor],
    dst: &[&Tensor],
    tuning: &Tuning,
) -> Result<()> {
    let sd = check_side(plan.src_grid(), src, "source", false)?;
    let dd = check_side(plan.dst_grid(), dst, "target", true)?;
    let dtype = match (sd, dd) {
        (Some(a), Some(b)) if a != b => {
            return Err(Error::shape(
                "copy_plan: source and target dtypes differ",
                format!("{a} and {b}"),
            ))
        }
        (Some(a), _) => a,
        _ => return Ok(()), // no partitions, so no copies
    };
    if plan.is_empty() {
        return Ok(());
    }
    let item = dtype.itemsize();
    with_scratch(|rows| copy_classified(plan, src, dst, tuning, item, rows))
}

/// Most bytes of row descriptors kept between calls, per thread.
const SCRATCH_KEEP: usize = 4 << 20;

thread_local! {
    /// Row descriptors of the last call on this thread, kept for the next. With a fresh
    /// buffer per call (1.1 MiB for small_grid/1MiB's 16,129 boxes) that call took about 500
    /// page faults (getrusage over 100 calls), the allocator handing back fresh pages for it
    /// and for the targets alike; with the buffer kept, none.
    static SCRATCH: std::cell::RefCell<Vec<RowBox>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Calls `f` with this thread's empty scratch buffer (a new one if a call on this thread is
/// already using it), emptied again afterwards.
fn with_scratch<R>(f: impl FnOnce(&mut Vec<RowBox>) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut rows) => {
            rows.clear();
            let r = f(&mut rows);
            rows.clear();
            if rows.capacity() * std::mem::size_of::<RowBox>() > SCRATCH_KEEP {
                *rows = Vec::new();
            }
            r
        }
        Err(_) => f(&mut Vec::new()),
    })
}

/// The rest of [`copy_plan`], once the tensors are checked, with `rows` an empty buffer.
fn copy_classified(
    plan: &Plan,
    src: &[&Tensor],
    dst: &[&Tensor],
    tuning: &Tuning,
    item: usize,
    rows: &mut Vec<RowBox>,
) -> Result<()> {
    let itemi = item as isize;
    let tensor_span = |t: &Tensor| span(t.data_ptr(), t.shape(), t.strides(), item);
    let src_spans: Vec<(usize, usize)> = src.iter().map(|t| tensor_span(t)).collect();
    let dst_spans: Vec<(usize, usize)> = dst.iter().map(|t| tensor_span(t)).collect();
    // The tensors claim their elements only (not their spans): a column block leaves the
    // next block's columns to other threads.
    let claim = access::tensors(
        "partition copy",
        access::numbered("source partition", src.iter().copied()),
        access::numbered("target partition", dst.iter().copied()),
    )?;
    rows.reserve(plan.len());
    let mut rows_bytes = 0usize;
    let mut general: Vec<General> = Vec::new();
    let mut shapes: Vec<usize> = Vec::new();
    let mut aliased: Vec<General> = Vec::new();
    plan.ops().visit(|op| {
        let (s, d) = (src[op.src], dst[op.dst]);
        let sp = s
            .data_ptr()
            .wrapping_offset(offset(s, &op.src_start, itemi));
        let dp = d
            .data_ptr()
            .wrapping_offset(offset(d, &op.dst_start, itemi));
        // Only tensors that share memory can make a box read what it writes.
        if overlap(src_spans[op.src], dst_spans[op.dst])
            && overlap(
                span(sp, &op.shape, s.strides(), item),
                span(dp, &op.shape, d.strides(), item),
            )
        {
            aliased.push(General::of(op, sp, dp, &mut shapes));
            return;
        }
        match classify(op, s, d, sp, dp, item) {
            Shape::Rows(b) => {
                rows_bytes += b.bytes();
                rows.push(b);
            }
            Shape::General => general.push(General::of(op, sp, dp, &mut shapes)),
        }
    });

    let nd = plan.src_grid().ndim();
    let box_shape = |g: &General| &shapes[g.shape_at..g.shape_at + nd];
    // A box that reads what it writes reads a packed copy of its source, made before any
    // box is written: no other box writes that source (the trait's contract), and a failed
    // allocation leaves every target as it was.
    let temps: Vec<_> = aliased
        .iter()
        .map(|g| {
            let view = SrcView {
                ptr: g.src_ptr,
                shape: box_shape(g),
                strides: src[g.src].strides(),
            };
            packed(view, item)
        })
        .collect::<Result<_>>()?;

    // SAFETY: every box of the plan lies inside its tensors (checked against the grids
    // above), destinations are writable host memory, boxes reading what they write were set
    // aside, and the trait's contract keeps destinations apart from each other and from the
    // other boxes' sources.
    unsafe { run_row_boxes(rows, rows_bytes, tuning) };

    let dst_view = |g: &General| DstView {
        ptr: g.dst_ptr,
        shape: box_shape(g),
        strides: dst[g.dst].strides(),
    };
    let raw: Vec<RawCopy<'_>> = general
        .iter()
        .map(|g| RawCopy {
            src: SrcView {
                ptr: g.src_ptr,
                shape: box_shape(g),
                strides: src[g.src].strides(),
            },
            dst: dst_view(g),
            itemsize: item,
        })
        .chain(
            aliased
                .iter()
                .zip(&temps)
                .map(|(g, (buf, strides))| RawCopy {
                    src: SrcView {
                        ptr: buf.as_ptr(),
                        shape: box_shape(g),
                        strides,
                    },
                    dst: dst_view(g),
                    itemsize: item,
                }),
        )
        .collect();
    // SAFETY: as above; the aliased boxes read their own packed copies, which nothing else
    // touches.
    unsafe { copy_boxes_tuned(&raw, Stores::Auto, tuning) };
    drop(claim);
    Ok(())
}

/// Runs `rows` (`bytes` in all), cut into pieces of about the same bytes for threads.
///
/// # Safety
/// Each box as for [`run_rows`]; no two boxes' destinations overlap, and no destination
/// overlaps another box's source.
unsafe fn run_row_boxes(rows: &[RowBox], bytes: usize, tuning: &Tuning) {
    let store = store_for(Stores::Auto, bytes);
    if !tuning.parallel(bytes) || bytes < tuning.rows_parallel_min {
        // SAFETY: forwarded caller contract.
        unsafe { run_piece(rows, store) };
        nontemporal::fence(store);
        return;
    }
    let piece = tuning.piece(bytes);
    let mut cuts = vec![0];
    let mut acc = 0;
    for (i, b) in rows.iter().enumerate() {
        acc += b.bytes();
        if acc >= piece {
            cuts.push(i + 1);
            acc = 0;
        }
    }
    if *cuts.last().expect("a cut") < rows.len() {
        cuts.push(rows.len());
    }
    let done = tuning.run(cuts.len() - 1, 1, |k| {
        // SAFETY: forwarded caller contract; each box is run by one thread.
        unsafe { run_piece(&rows[cuts[k]..cuts[k + 1]], store) };
        nontemporal::fence(store);
        Ok::<(), ()>(())
    });
    debug_assert!(done.is_ok());
}
