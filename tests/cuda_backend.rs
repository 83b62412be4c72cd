//! Every backend operation test, written once over a device and run on each backend: the CPU
//! backend; the CUDA backend over the host emulation of the driver (feature
//! `kernel-host-tests`: the backend's own code from the trait down to the launch, with the
//! real kernel source run on the host); and the CUDA backend on a real GPU when there is one.
//! Without a GPU the real run is skipped (printing `SKIP` and the reason), unless
//! `DLPART_REQUIRE_CUDA=1`, which turns that into a failure (set on GPU machines).
//! libnvrtc must be on the loader path for the real GPU (see tests/cuda_ptx.rs).
//!
//! The emulated backend is not reachable through `dlpart::ops` (which picks backends by
//! device, and users must never get an emulated `kDLCUDA` device), so the bodies drive the
//! `Backend` trait as `ops` does; on the devices `ops` reaches they run `ops` as well.

use std::ptr::NonNull;
use std::sync::Arc;

use dlpart::backend::cpu::CpuBackend;
use dlpart::backend::cuda::CudaBackend;
use dlpart::backend::{backend_for, Backend, BoxCopy};
use dlpart::dlpack::{export_versioned, live_exports, ForeignTensor};
use ndarray::Dimension;

use dlpart::{
    DType, Device, DeviceType, Error, Grid, Plan, PreparedGather, PreparedScatter, Tensor,
};

/// Emulated CUDA devices are `kDLCUDA:1000` and up (see `CudaBackend::emulated`).
fn is_emulated(d: Device) -> bool {
    d.kind == DeviceType::Cuda && d.id >= 1000
}

/// The real GPU 0, or `None` (with the reason printed) when there is none and none is
/// required.
fn real_gpu(test: &str) -> Option<Arc<CudaBackend>> {
    let required = std::env::var("DLPART_REQUIRE_CUDA").as_deref() == Ok("1");
    match CudaBackend::get(Device::cuda(0)) {
        Ok(b) => Some(b),
        Err(e) if required && cfg!(feature = "cuda") => panic!("CUDA backend unavailable: {e}"),
        Err(e) => {
            eprintln!("SKIP {test} on kDLCUDA:0: {e}");
            None
        }
    }
}

/// The backends every test body runs on.
fn backends(test: &str) -> Vec<Arc<dyn Backend>> {
    let mut all: Vec<Arc<dyn Backend>> = vec![CpuBackend::shared(Device::CPU)];
    #[cfg(feature = "kernel-host-tests")]
    all.push(CudaBackend::emulated(0));
    if let Some(gpu) = real_gpu(test) {
        all.push(gpu);
    }
    all
}

/// Names the device when a body panics on it.
struct Running(Device);
impl Drop for Running {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("failed on {}", self.0);
        }
    }
}

/// Runs `body` once per backend.
fn on_every_backend(test: &str, body: impl Fn(&dyn Backend)) {
    for be in backends(test) {
        eprintln!("RUN {test} on {}", be.device());
        let _running = Running(be.device());
        body(be.as_ref());
    }
}

/// Whether `dlpart::ops` reaches `be` (every backend but the emulated ones).
fn ops_reach(be: &dyn Backend) -> bool {
    backend_for(be.device()).is_ok_and(|b| b.device() == be.device())
}

/// Other devices `be` transfers to: none for the CPU; emulated devices 1 (peer access) and 2
/// (staged through pinned memory) for the emulated device 0; GPU 1 when there is one.
fn other_devices(be: &dyn Backend) -> Vec<Arc<dyn Backend>> {
    let d = be.device();
    if d.kind != DeviceType::Cuda {
        return Vec::new();
    }
    #[cfg(feature = "kernel-host-tests")]
    if is_emulated(d) {
        return vec![CudaBackend::emulated(1), CudaBackend::emulated(2)];
    }
    match CudaBackend::get(Device::cuda(1)) {
        Ok(b) => vec![b],
        Err(e) => {
            eprintln!("SKIP transfers to kDLCUDA:1: {e}");
            Vec::new()
        }
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const DTYPES: [DType; 5] = [
    DType::UInt8,
    DType::Int16,
    DType::Float32,
    DType::Float64,
    DType::Complex128,
];

/// A contiguous host tensor of random bytes.
fn random_host(rng: &mut Rng, shape: &[usize], dtype: DType) -> Tensor {
    let t = Tensor::zeros(shape, dtype).unwrap();
    // SAFETY: `t` is a fresh contiguous host allocation of `nbytes` bytes that nothing else
    // references yet.
    let bytes = unsafe { std::slice::from_raw_parts_mut(t.data_ptr(), t.nbytes()) };
    bytes.iter_mut().for_each(|b| *b = rng.next() as u8);
    t
}

fn host_bytes(t: &Tensor) -> Vec<u8> {
    assert!(t.is_contiguous() && t.device() == Device::CPU);
    // SAFETY: a contiguous host tensor's elements are its `nbytes` bytes from `data_ptr`.
    unsafe { std::slice::from_raw_parts(t.data_ptr(), t.nbytes()) }.to_vec()
}

/// A copy of the host tensor `host` on `be`'s device.
fn upload(be: &dyn Backend, host: &Tensor) -> Tensor {
    let d = be.empty(host.shape(), host.dtype()).unwrap();
    be.transfer(host, &d).unwrap();
    d
}

/// A contiguous host copy of `t` (on `be`'s device).
fn download(be: &dyn Backend, t: &Tensor) -> Tensor {
    let h = Tensor::zeros(t.shape(), t.dtype()).unwrap();
    be.transfer(t, &h).unwrap();
    h
}

fn download_f32(be: &dyn Backend, t: &Tensor) -> Vec<f32> {
    download(be, t)
        .to_array::<f32>()
        .unwrap()
        .into_raw_vec_and_offset()
        .0
}

/// `t` with dim `d` reversed: same elements, negative stride (works for any device).
fn reversed(t: &Tensor, d: usize) -> Tensor {
    let mut strides = t.strides().to_vec();
    let n = t.shape()[d] as isize;
    let item = t.dtype().itemsize() as isize;
    let data = t.data_ptr().wrapping_offset((n - 1) * strides[d] * item);
    strides[d] = -strides[d];
    // SAFETY: the reversed view addresses exactly the elements of `t`, kept alive by its owner.
    unsafe {
        Tensor::from_raw_parts(
            data,
            t.shape().to_vec(),
            strides,
            t.dtype(),
            t.device(),
            false,
            t.owner().clone(),
        )
    }
}

/// A view of `t`'s memory from byte `offset` as `dtype` with `shape` and `strides` (elements).
fn reinterpret(
    t: &Tensor,
    offset: usize,
    dtype: DType,
    shape: &[usize],
    strides: &[isize],
) -> Tensor {
    // SAFETY: the callers' views stay inside `t`'s bytes, kept alive by its owner.
    unsafe {
        Tensor::from_raw_parts(
            t.data_ptr().wrapping_add(offset),
            shape.to_vec(),
            strides.to_vec(),
            dtype,
            t.device(),
            false,
            t.owner().clone(),
        )
    }
}

/// A contiguous host copy of a (possibly strided) host tensor.
fn contiguous_host(t: &Tensor) -> Tensor {
    let out = Tensor::zeros(t.shape(), t.dtype()).unwrap();
    let zero = vec![0; t.ndim()];
    CpuBackend::shared(Device::CPU)
        .copy_boxes(&[BoxCopy {
            src: t,
            src_start: zero.clone(),
            dst: &out,
            dst_start: zero,
            shape: t.shape().to_vec(),
        }])
        .unwrap();
    out
}

/// (source start, destination start, shape)
type Box3 = (Vec<usize>, Vec<usize>, Vec<usize>);

/// Runs `boxes` in two `copy_boxes` calls queued back to back, then waits once.
fn run_boxes(b: &dyn Backend, src: &Tensor, dst: &Tensor, boxes: &[Box3]) {
    let copies: Vec<BoxCopy> = boxes
        .iter()
        .map(|(ss, ds, shape)| BoxCopy {
            src,
            src_start: ss.clone(),
            dst,
            dst_start: ds.clone(),
            shape: shape.clone(),
        })
        .collect();
    let (first, second) = copies.split_at(copies.len() / 2);
    b.copy_boxes(first).unwrap();
    b.copy_boxes(second).unwrap();
    b.synchronize().unwrap();
}

#[test]
fn box_copies_match_the_cpu_backend() {
    on_every_backend("box_copies_match_the_cpu_backend", |be| {
        let cpu = CpuBackend::shared(Device::CPU);
        let mut rng = Rng(11);
        for case in 0..40 {
            let dtype = DTYPES[rng.below(DTYPES.len())];
            let ndim = 1 + rng.below(4);
            let shape: Vec<usize> = (0..ndim).map(|_| 1 + rng.below(40)).collect();
            let (hs, hd) = (
                random_host(&mut rng, &shape, dtype),
                random_host(&mut rng, &shape, dtype),
            );
            let (mut ds, mut dd) = (upload(be, &hs), upload(be, &hd));
            let (mut hs, mut hd) = (hs, hd);
            if rng.below(2) == 0 {
                let d = rng.below(ndim);
                (hs, ds) = (reversed(&hs, d), reversed(&ds, d));
            }
            if rng.below(2) == 0 {
                let d = rng.below(ndim);
                (hd, dd) = (reversed(&hd, d), reversed(&dd, d));
            }
            // Disjoint destination slabs along dim 0, each fed from a random source box.
            let mut boxes = Vec::new();
            let mut start = 0;
            while start < shape[0] {
                let rows = 1 + rng.below(shape[0] - start);
                let mut box_shape: Vec<usize> = shape.iter().map(|&n| 1 + rng.below(n)).collect();
                box_shape[0] = rows;
                let src_start: Vec<usize> = (0..ndim)
                    .map(|d| rng.below(shape[d] - box_shape[d] + 1))
                    .collect();
                let mut dst_start: Vec<usize> = (0..ndim)
                    .map(|d| rng.below(shape[d] - box_shape[d] + 1))
                    .collect();
                dst_start[0] = start;
                boxes.push((src_start, dst_start, box_shape));
                start += rows;
            }
            run_boxes(cpu.as_ref(), &hs, &hd, &boxes);
            run_boxes(be, &ds, &dd, &boxes);
            let got = contiguous_host(&download(be, &dd));
            let expect = contiguous_host(&hd);
            assert_eq!(
                host_bytes(&got),
                host_bytes(&expect),
                "case {case}: {dtype} {shape:?}"
            );
        }
    });
}

/// `0, 1, 2, ...` as a host float32 tensor of `shape`.
fn iota(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let vals: Vec<f32> = (0..n).map(|i| i as f32).collect();
    Tensor::from_slice(&vals, shape).unwrap()
}

/// Runs `plan`'s copies from `src` into `dst` on `be`, as `ops::repartition_into` does for
/// partitions that all live on one device.
fn run_plan(be: &dyn Backend, plan: &Plan, src: &[Tensor], dst: &[Tensor]) {
    let mut jobs = Vec::new();
    plan.ops().visit(|op| {
        jobs.push(BoxCopy {
            src: &src[op.src],
            src_start: op.src_start.clone(),
            dst: &dst[op.dst],
            dst_start: op.dst_start.clone(),
            shape: op.shape.clone(),
        })
    });
    be.copy_boxes(&jobs).unwrap();
    be.synchronize().unwrap();
}

/// Checks that `parts` (on `be`) are the partitions of `grid` cut from `full` (host).
fn assert_partitions(be: &dyn Backend, grid: &Grid, full: &Tensor, parts: &[Tensor]) {
    let full = full.to_array::<f32>().unwrap();
    for (j, part) in parts.iter().enumerate() {
        let r = grid.region_at(j);
        let got = download(be, part).to_array::<f32>().unwrap();
        for (ix, &v) in got.indexed_iter() {
            let at: Vec<usize> = ix
                .slice()
                .iter()
                .zip(&r.start)
                .map(|(&i, &s)| i + s)
                .collect();
            assert_eq!(v, full[at.as_slice()], "partition {j} at {ix:?}");
        }
    }
}

#[test]
fn repartition_moves_row_blocks_to_uneven_column_blocks() {
    on_every_backend(
        "repartition_moves_row_blocks_to_uneven_column_blocks",
        |be| {
            let shape = [37, 50];
            let full = iota(&shape);
            let sg = Grid::even(&shape, &[4, 1]).unwrap();
            let dg = Grid::from_splits(&shape, vec![vec![0, 37], vec![0, 3, 4, 29, 50]]).unwrap();
            let plan = Plan::new(&sg, &dg).unwrap();
            let src: Vec<Tensor> = (0..sg.num_partitions())
                .map(|i| {
                    let r = sg.region_at(i);
                    upload(
                        be,
                        &contiguous_host(&full.view(&r.start, &r.shape).unwrap()),
                    )
                })
                .collect();
            let shapes: Vec<Vec<usize>> = (0..dg.num_partitions())
                .map(|j| dg.region_at(j).shape)
                .collect();
            let refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
            let dst = be.empty_many(&refs, DType::Float32).unwrap();
            run_plan(be, &plan, &src, &dst);
            assert_partitions(be, &dg, &full, &dst);
            if ops_reach(be) {
                let devices = vec![be.device(); dg.num_partitions()];
                let out = dlpart::ops::repartition(&plan, &src, &devices, false).unwrap();
                assert_partitions(be, &dg, &full, &out);
            }
        },
    );
}

#[test]
fn repartition_into_fills_strided_targets() {
    on_every_backend("repartition_into_fills_strided_targets", |be| {
        let shape = [12, 10, 3];
        let full = iota(&shape);
        let sg = Grid::even(&shape, &[3, 2, 1]).unwrap();
        let dg = Grid::even(&shape, &[1, 1, 3]).unwrap();
        let plan = Plan::new(&sg, &dg).unwrap();
        let src: Vec<Tensor> = (0..sg.num_partitions())
            .map(|i| {
                let r = sg.region_at(i);
                upload(
                    be,
                    &contiguous_host(&full.view(&r.start, &r.shape).unwrap()),
                )
            })
            .collect();
        // Each target is a reversed view inside a bigger buffer of the caller's.
        let targets = |be: &dyn Backend| -> Vec<Tensor> {
            (0..dg.num_partitions())
                .map(|_| {
                    let big = upload(be, &Tensor::zeros(&[14, 10, 2], DType::Float32).unwrap());
                    reversed(&big.view(&[1, 0, 1], &[12, 10, 1]).unwrap(), 0)
                })
                .collect()
        };
        let dst = targets(be);
        run_plan(be, &plan, &src, &dst);
        assert_partitions(be, &dg, &full, &dst);
        if ops_reach(be) {
            let dst = targets(be);
            dlpart::ops::repartition_into(&plan, &src, &dst, false).unwrap();
            assert_partitions(be, &dg, &full, &dst);
            let ro: Vec<Tensor> = dst.iter().map(|t| t.with_readonly(true).unwrap()).collect();
            assert!(matches!(
                dlpart::ops::repartition_into(&plan, &src, &ro, false),
                Err(Error::ReadOnly { .. })
            ));
        }
    });
}

/// Naive gather/scatter on host bytes, C-order over the index space `shape`.
fn reference(
    gather: bool,
    src: &Tensor,
    idx: &[i64],
    axis: usize,
    out: &Tensor,
    shape: &[usize],
) -> Vec<u8> {
    let item = src.dtype().itemsize();
    let (s, mut o) = (host_bytes(src), host_bytes(out));
    let strides = |t: &Tensor| dlpart::tensor::contiguous_strides(t.shape());
    let (ss, os) = (strides(src), strides(out));
    let n: usize = shape.iter().product();
    for lin in 0..n {
        let mut rem = lin;
        let mut ix = vec![0usize; shape.len()];
        for d in (0..shape.len()).rev() {
            ix[d] = rem % shape[d];
            rem /= shape[d];
        }
        let (mut si, mut oi) = (ix.clone(), ix.clone());
        let len = if gather {
            src.shape()[axis]
        } else {
            out.shape()[axis]
        } as i64;
        let target = idx[ix[axis]].rem_euclid(len) as usize;
        if gather {
            si[axis] = target;
        } else {
            oi[axis] = target;
        }
        let off = |i: &[usize], st: &[isize]| {
            i.iter()
                .zip(st)
                .map(|(&a, &b)| a as isize * b)
                .sum::<isize>() as usize
                * item
        };
        let (a, b) = (off(&si, &ss), off(&oi, &os));
        o[b..b + item].copy_from_slice(&s[a..a + item]);
    }
    o
}

#[test]
fn gather_and_scatter_match_naive_loops() {
    on_every_backend("gather_and_scatter_match_naive_loops", |be| {
        let mut rng = Rng(5);
        for case in 0..40 {
            let gather = case % 2 == 0;
            let dtype = DTYPES[rng.below(DTYPES.len())];
            let ndim = 1 + rng.below(3);
            let shape: Vec<usize> = (0..ndim).map(|_| 1 + rng.below(33)).collect();
            let axis = rng.below(ndim);
            let len = 1 + rng.below(20);
            let mut indexed = shape.clone();
            indexed[axis] = len;
            // Negative indices count from the end.
            let idx: Vec<i64> = (0..shape[axis])
                .map(|_| rng.below(2 * len) as i64 - len as i64)
                .collect();
            let (src_shape, out_shape) = if gather {
                (&indexed, &shape)
            } else {
                (&shape, &indexed)
            };
            let hs = random_host(&mut rng, src_shape, dtype);
            let ho = random_host(&mut rng, out_shape, dtype);
            let hi = Tensor::from_slice(&idx, &[idx.len()]).unwrap();
            let (ds, d_o) = (upload(be, &hs), upload(be, &ho));
            // Host indices half the time, indices already on the device otherwise.
            let raw = if case % 4 < 2 { hi } else { upload(be, &hi) };
            let di = be.normalise_indices(&raw, axis, len).unwrap();
            assert_eq!((di.dtype(), di.device()), (DType::Int64, be.device()));
            if gather {
                be.gather(&ds, &di, axis, &d_o).unwrap();
            } else {
                be.scatter(&ds, &di, axis, &d_o).unwrap();
            }
            be.synchronize().unwrap();
            let want = reference(gather, &hs, &idx, axis, &ho, &shape);
            assert_eq!(
                host_bytes(&download(be, &d_o)),
                want,
                "case {case}: gather={gather} {dtype} {shape:?} axis {axis}"
            );
        }
    });
}

/// Prepared gathers and scatters, made once and run while the data changes under them: on
/// every backend through `on`, and through `new` where `ops` reaches the backend.
#[test]
fn prepared_gathers_and_scatters_follow_changing_data() {
    let test = "prepared_gathers_and_scatters_follow_changing_data";
    for be in backends(test) {
        eprintln!("RUN {test} on {}", be.device());
        let _running = Running(be.device());
        let b = be.as_ref();
        let mut rng = Rng(21);
        for case in 0..12 {
            let shape: Vec<usize> = (0..3).map(|_| 1 + rng.below(9)).collect();
            let axis = rng.below(3);
            let len = shape[axis];
            // Negative and repeated indices; the scatter keeps the last of repeated ones.
            let idx: Vec<i64> = (0..1 + rng.below(5))
                .map(|_| rng.below(2 * len) as i64 - len as i64)
                .collect();
            let mut small = shape.clone();
            small[axis] = idx.len();
            let hi = Tensor::from_slice(&idx, &[idx.len()]).unwrap();
            let indices = if case % 2 == 0 { hi } else { upload(b, &hi) };
            let src = upload(b, &random_host(&mut rng, &shape, DType::Float32));
            let out = b.empty(&small, DType::Float32).unwrap();
            let dst = upload(b, &random_host(&mut rng, &shape, DType::Float32));
            let (g, s) = if ops_reach(b) && case % 3 == 0 {
                (
                    PreparedGather::new(&src, &indices, axis, Some(&out)).unwrap(),
                    PreparedScatter::new(&out, &indices, &dst, axis).unwrap(),
                )
            } else {
                (
                    PreparedGather::on(be.clone(), &src, &indices, axis, Some(&out)).unwrap(),
                    PreparedScatter::on(be.clone(), &out, &indices, &dst, axis).unwrap(),
                )
            };
            for run in 0..3 {
                let hs = random_host(&mut rng, &shape, DType::Float32);
                b.transfer(&hs, &src).unwrap(); // new data in the same memory
                let (out_before, dst_before) = (download(b, &out), download(b, &dst));
                g.run().unwrap();
                let got = download(b, &out);
                let what = format!("case {case} run {run}: {shape:?} axis {axis} {idx:?}");
                assert_eq!(
                    host_bytes(&got),
                    reference(true, &hs, &idx, axis, &out_before, &small),
                    "gather {what}"
                );
                s.run().unwrap();
                assert_eq!(
                    host_bytes(&download(b, &dst)),
                    reference(false, &got, &idx, axis, &dst_before, &small),
                    "scatter {what}"
                );
            }
        }
    }
}

/// Scatter values broadcast to the shape written, as numpy's fancy assignment broadcasts
/// them: the kernels read the broadcast view's zero strides on every backend.
#[test]
fn scatter_broadcasts_values_on_every_backend() {
    let test = "scatter_broadcasts_values_on_every_backend";
    for be in backends(test) {
        eprintln!("RUN {test} on {}", be.device());
        let _running = Running(be.device());
        let b = be.as_ref();
        let host: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let idx = Tensor::from_slice(&[2i64, 0], &[2]).unwrap();
        // numpy: a = arange(12).reshape(3, 4); a[[2, 0]] = values
        let cases: [(&[f32], &[usize], [f32; 8]); 3] = [
            (&[-1.], &[], [-1.; 8]),
            (
                &[-1., -2.],
                &[2, 1],
                [-1., -1., -1., -1., -2., -2., -2., -2.],
            ),
            (
                &[-1., -2., -3., -4.],
                &[1, 4],
                [-1., -2., -3., -4., -1., -2., -3., -4.],
            ),
        ];
        for (vals, shape, rows_2_then_0) in cases {
            let dst = upload(b, &Tensor::from_slice(&host, &[3, 4]).unwrap());
            let vals = upload(b, &Tensor::from_slice(vals, shape).unwrap());
            PreparedScatter::on(be.clone(), &vals, &idx, &dst, 0)
                .unwrap()
                .run()
                .unwrap();
            let mut want = host.clone();
            want[8..].copy_from_slice(&rows_2_then_0[..4]);
            want[..4].copy_from_slice(&rows_2_then_0[4..]);
            assert_eq!(download_f32(b, &dst), want, "values of shape {shape:?}");
        }
    }
}

/// One index (a 0-d tensor, host or device) drops the axis, as numpy's take and assignment
/// do: the kernels run over a slab of one, inserted into the caller's output or values.
#[test]
fn one_index_drops_the_axis_on_every_backend() {
    let test = "one_index_drops_the_axis_on_every_backend";
    for be in backends(test) {
        eprintln!("RUN {test} on {}", be.device());
        let _running = Running(be.device());
        let b = be.as_ref();
        let host: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let src = upload(b, &Tensor::from_slice(&host, &[3, 4]).unwrap());
        let one = Tensor::from_slice(&[-2i64], &[]).unwrap();
        for (k, idx) in [one.clone(), upload(b, &one)].iter().enumerate() {
            // numpy.take(arange(12).reshape(3, 4), -2, 1) == [2, 6, 10]
            let g = PreparedGather::on(be.clone(), &src, idx, 1, None).unwrap();
            g.run().unwrap();
            assert_eq!(g.out().shape(), &[3], "indices {k}");
            assert_eq!(
                download_f32(b, g.out()),
                vec![2.0, 6.0, 10.0],
                "indices {k}"
            );
            // a[-2] = [-1, -2, -3, -4]
            let dst = upload(b, &Tensor::from_slice(&host, &[3, 4]).unwrap());
            let vals = upload(
                b,
                &Tensor::from_slice(&[-1f32, -2., -3., -4.], &[4]).unwrap(),
            );
            PreparedScatter::on(be.clone(), &vals, idx, &dst, 0)
                .unwrap()
                .run()
                .unwrap();
            let mut want = host.clone();
            want[4..8].copy_from_slice(&[-1.0, -2.0, -3.0, -4.0]);
            assert_eq!(download_f32(b, &dst), want, "indices {k}");
        }
    }
}

#[test]
fn out_of_range_indices_are_reported_and_nothing_is_written() {
    on_every_backend(
        "out_of_range_indices_are_reported_and_nothing_is_written",
        |be| {
            let src = upload(be, &Tensor::from_slice(&[1f32, 2., 3., 4.], &[4]).unwrap());
            let bad = Tensor::from_slice(&[0i64, 7, -9, 1], &[4]).unwrap();
            for idx in [bad.clone(), upload(be, &bad)] {
                match be.normalise_indices(&idx, 0, 4) {
                    Err(Error::IndexOutOfRange {
                        index: 7,
                        axis: 0,
                        len: 4,
                    }) => {}
                    other => panic!("expected index 7 out of range, got {other:?}"),
                }
            }
            let out = upload(be, &Tensor::from_slice(&[0f32; 3], &[3]).unwrap());
            // The gather and scatter kernels check again what they read (the CPU likewise).
            let unchecked = upload(be, &Tensor::from_slice(&[0i64, 7, 1], &[3]).unwrap());
            match be.gather(&src, &unchecked, 0, &out) {
                Err(Error::IndexOutOfRange {
                    index: 7,
                    axis: 0,
                    len: 4,
                }) => {}
                other => panic!("expected index 7 out of range, got {other:?}"),
            }
            let dst = upload(be, &Tensor::from_slice(&[0f32; 4], &[4]).unwrap());
            let vals = upload(be, &Tensor::from_slice(&[9f32, 8., 7.], &[3]).unwrap());
            assert!(matches!(
                be.scatter(&vals, &unchecked, 0, &dst),
                Err(Error::IndexOutOfRange { index: 7, .. })
            ));
            // The backend stays usable; later duplicates win.
            let dst = upload(be, &Tensor::from_slice(&[0f32; 4], &[4]).unwrap());
            let ok = upload(be, &Tensor::from_slice(&[3i64, 0, 3], &[3]).unwrap());
            be.scatter(&vals, &ok, 0, &dst).unwrap();
            be.synchronize().unwrap();
            assert_eq!(download_f32(be, &dst), vec![8., 0., 0., 7.]);
            if ops_reach(be) {
                // ops check every index before writing anything.
                let out = upload(be, &Tensor::from_slice(&[0f32; 4], &[4]).unwrap());
                assert!(matches!(
                    dlpart::ops::gather(&src, &bad, 0, Some(&out)),
                    Err(Error::IndexOutOfRange { index: 7, .. })
                ));
                assert_eq!(download_f32(be, &out), vec![0.; 4]);
                let dst = upload(be, &Tensor::from_slice(&[0f32; 4], &[4]).unwrap());
                assert!(matches!(
                    dlpart::ops::scatter(&vals, bad.view(&[0], &[3]).unwrap(), &dst, 0),
                    Err(Error::IndexOutOfRange { index: 7, .. })
                ));
                assert_eq!(download_f32(be, &dst), vec![0.; 4]);
            }
        },
    );
}

#[test]
fn scatter_into_a_long_axis_keeps_the_last_duplicate() {
    // One winner word per position of the axis would take 800 KB here; the CUDA backend's
    // table is hashed and sized by the 5 indices instead (two of them the same slot).
    on_every_backend("scatter_into_a_long_axis_keeps_the_last_duplicate", |be| {
        let len = 100_000;
        let dst = upload(be, &Tensor::zeros(&[2, len], DType::Float32).unwrap());
        let vals: Vec<f32> = (1..=10).map(|v| v as f32).collect();
        let vals = upload(be, &Tensor::from_slice(&vals, &[2, 5]).unwrap());
        let raw = Tensor::from_slice(&[99_999i64, 0, 50_000, -1, 7], &[5]).unwrap();
        let idx = be.normalise_indices(&raw, 1, len).unwrap();
        be.scatter(&vals, &idx, 1, &dst).unwrap();
        be.synchronize().unwrap();
        let got = download(be, &dst).to_array::<f32>().unwrap();
        for (row, base) in [(0, 0.), (1, 5.)] {
            let at = |i: usize| got[[row, i]];
            assert_eq!(
                (at(0), at(7), at(50_000), at(len - 1)),
                (base + 2., base + 5., base + 3., base + 4.),
                "row {row}"
            );
            let nonzero = (0..len).filter(|&i| at(i) != 0.).count();
            assert_eq!(nonzero, 4, "row {row}");
        }
        // Gathered back through the same long axis.
        let out = be.empty(&[2, 5], DType::Float32).unwrap();
        be.gather(&dst, &idx, 1, &out).unwrap();
        be.synchronize().unwrap();
        assert_eq!(
            download_f32(be, &out),
            vec![4., 2., 3., 4., 5., 9., 7., 8., 9., 10.]
        );
    });
}

#[test]
fn indices_of_every_dtype_and_layout_are_normalised() {
    on_every_backend("indices_of_every_dtype_and_layout_are_normalised", |be| {
        let src = upload(
            be,
            &Tensor::from_slice(&[10f32, 11., 12., 13., 14.], &[5]).unwrap(),
        );
        let gather = |idx: &Tensor| {
            let i = be.normalise_indices(idx, 0, 5).unwrap();
            let out = be.empty(&[i.shape()[0]], DType::Float32).unwrap();
            be.gather(&src, &i, 0, &out).unwrap();
            be.synchronize().unwrap();
            download_f32(be, &out)
        };
        // Host indices of any integer dtype; negative ones count from the end.
        let host = Tensor::from_slice(&[-1i32, 0, 2, -5], &[4]).unwrap();
        assert_eq!(gather(&host), vec![14., 10., 12., 10.]);
        // Device int64 indices, reversed (stride -1) and negative.
        let dev = upload(be, &Tensor::from_slice(&[1i64, -2, 4], &[3]).unwrap());
        assert_eq!(gather(&reversed(&dev, 0)), vec![14., 13., 11.]);
        // Device int32 indices every other element, and uint16 ones.
        let dev32 = upload(be, &Tensor::from_slice(&[2i32, 99, -1, 99], &[4]).unwrap());
        assert_eq!(
            gather(&reinterpret(&dev32, 0, DType::Int32, &[2], &[2])),
            vec![12., 14.]
        );
        let dev16 = upload(be, &Tensor::from_slice(&[4u16, 3], &[2]).unwrap());
        assert_eq!(gather(&dev16), vec![14., 13.]);
        // An int64 index at an odd address.
        let mut bytes = vec![0u8; 9];
        bytes[1] = 3;
        let raw = upload(be, &Tensor::from_slice(&bytes, &[9]).unwrap());
        assert_eq!(
            gather(&reinterpret(&raw, 1, DType::Int64, &[1], &[1])),
            vec![13.]
        );
        // In-range contiguous int64 indices on the device: every backend returns a copy it
        // owns, each index read once, so rewriting the caller's array after the check (as
        // another thread may) changes nothing the kernels read.
        let plain = upload(be, &Tensor::from_slice(&[0i64, 4], &[2]).unwrap());
        let copy = be.normalise_indices(&plain, 0, 5).unwrap();
        assert_eq!(copy.device(), plain.device());
        assert_ne!(copy.data_ptr(), plain.data_ptr());
        let rewritten = Tensor::from_slice(&[1i64 << 40, -(1i64 << 40)], &[2]).unwrap();
        be.transfer(&rewritten, &plain).unwrap();
        let values = download(be, &copy).to_array::<i64>().unwrap();
        assert_eq!(values.into_raw_vec_and_offset().0, vec![0, 4]);
        let out = be.empty(&[2], DType::Float32).unwrap();
        be.gather(&src, &copy, 0, &out).unwrap();
        be.synchronize().unwrap();
        assert_eq!(download_f32(be, &out), vec![10., 14.]);
        let huge = upload(be, &Tensor::from_slice(&[1u64, u64::MAX], &[2]).unwrap());
        assert!(matches!(
            be.normalise_indices(&huge, 0, 5),
            Err(Error::IndexOutOfRange { index, .. }) if index == u64::MAX as i128
        ));
        assert!(be.normalise_indices(&iota(&[2]), 0, 5).is_err()); // float indices
        let none = be
            .normalise_indices(&Tensor::zeros(&[0], DType::Int8).unwrap(), 0, 5)
            .unwrap();
        assert_eq!((none.shape(), none.dtype()), (&[0usize][..], DType::Int64));
    });
}

#[test]
fn transfers_handle_strided_tensors_on_both_sides() {
    on_every_backend("transfers_handle_strided_tensors_on_both_sides", |be| {
        let vals: Vec<i32> = (0..60).collect();
        let host = Tensor::from_slice(&vals, &[3, 4, 5]).unwrap();
        let dev = be.empty(&[3, 4, 5], DType::Int32).unwrap();
        be.transfer(&reversed(&host, 1), &reversed(&dev, 2))
            .unwrap();
        let back = Tensor::zeros(&[3, 4, 5], DType::Int32).unwrap();
        be.transfer(&reversed(&dev, 2), &reversed(&back, 1))
            .unwrap();
        assert_eq!(
            back.to_array::<i32>().unwrap(),
            host.to_array::<i32>().unwrap()
        );
        let expect = reversed(&reversed(&host, 1), 2).to_array::<i32>().unwrap();
        assert_eq!(download(be, &dev).to_array::<i32>().unwrap(), expect);
        // Shapes must match; empty tensors move nothing.
        let small = be.empty(&[3, 4], DType::Int32).unwrap();
        assert!(be.transfer(&host, &small).is_err());
        let empty = be.empty(&[0, 4], DType::Int32).unwrap();
        be.transfer(&Tensor::zeros(&[0, 4], DType::Int32).unwrap(), &empty)
            .unwrap();
        // To and from other devices, both ways, strided.
        for other in other_devices(be) {
            // The source is still being written by work queued on this device: the other
            // device must wait for it.
            let queued = be.empty(&[3, 4, 5], DType::Int32).unwrap();
            run_queued(be, &dev, &queued);
            let there = other.empty(&[3, 4, 5], DType::Int32).unwrap();
            other.transfer(&reversed(&queued, 0), &there).unwrap();
            let want = reversed(&reversed(&reversed(&host, 1), 2), 0)
                .to_array::<i32>()
                .unwrap();
            assert_eq!(
                download(other.as_ref(), &there).to_array::<i32>().unwrap(),
                want,
                "to {}",
                other.device()
            );
            let again = be.empty(&[3, 4, 5], DType::Int32).unwrap();
            be.transfer(&there, &reversed(&again, 0)).unwrap();
            assert_eq!(
                download(be, &again).to_array::<i32>().unwrap(),
                expect,
                "from {}",
                other.device()
            );
        }
    });
}

/// Queues the copy of all of `src` into `dst` on `be` without waiting for it.
fn run_queued(be: &dyn Backend, src: &Tensor, dst: &Tensor) {
    let zero = vec![0; src.ndim()];
    be.copy_boxes(&[BoxCopy {
        src,
        src_start: zero.clone(),
        dst,
        dst_start: zero,
        shape: src.shape().to_vec(),
    }])
    .unwrap();
}

#[test]
fn dlpack_export_and_import_keep_the_memory_and_order_streams() {
    on_every_backend(
        "dlpack_export_and_import_keep_the_memory_and_order_streams",
        |be| {
            let host = iota(&[3, 4]);
            let t = reversed(&upload(be, &host), 1);
            let live = live_exports();
            let m = NonNull::new(export_versioned(&t, false)).unwrap();
            // SAFETY: a fresh export, owned from here on by the foreign tensor.
            let back = unsafe { ForeignTensor::from_versioned(m) }
                .into_tensor()
                .unwrap();
            assert_eq!(back.device(), be.device());
            assert_eq!(back.data_ptr(), t.data_ptr());
            assert_eq!((back.shape(), back.strides()), (t.shape(), t.strides()));
            assert!(!back.readonly());
            // The consumer reads the data through the imported tensor, on the device.
            let want = reversed(&host, 1).to_array::<f32>().unwrap();
            assert_eq!(download(be, &back).to_array::<f32>().unwrap(), want);
            drop(back);
            assert_eq!(live_exports(), live);
            // Streams: the consumer's waits on ours, whatever DLPack value it names.
            let ours = be.dlpack_stream();
            assert_eq!(ours.is_some(), be.device().kind == DeviceType::Cuda);
            for s in [None, Some(1), Some(2), Some(-1), ours] {
                be.make_consumer_wait(s).unwrap();
            }
            if let Some(ours) = ours {
                assert!(ours > 2);
                assert!(be.make_consumer_wait(Some(0)).is_err());
                assert!(be.make_consumer_wait(Some(-5)).is_err());
                // Data written after a wait is still what the consumer reads.
                let dst = be.empty(&[3, 4], DType::Float32).unwrap();
                run_boxes(be, &t, &dst, &[(vec![0, 0], vec![0, 0], vec![3, 4])]);
                be.make_consumer_wait(Some(2)).unwrap();
                assert_eq!(download(be, &dst).to_array::<f32>().unwrap(), want);
            }
            if is_emulated(be.device()) {
                // The emulation knows its streams: a made-up handle is refused.
                assert!(be.make_consumer_wait(Some(0x1234_5678)).is_err());
            }
        },
    );
}

#[test]
fn row_blocks_become_column_blocks_of_a_large_array() {
    on_every_backend("row_blocks_become_column_blocks_of_a_large_array", |be| {
        // The GPU moves 256 MiB; the host (CPU and emulated) a 4 MiB version of it.
        let real_gpu = be.device().kind == DeviceType::Cuda && !is_emulated(be.device());
        let n = if real_gpu { 8192usize } else { 1024 };
        let vals: Vec<u32> = (0..(n * n) as u32).collect();
        let full = upload(be, &Tensor::from_slice(&vals, &[n, n]).unwrap());
        let cols: Vec<Tensor> = (0..4)
            .map(|_| be.empty(&[n, n / 4], DType::UInt32).unwrap())
            .collect();
        let jobs: Vec<BoxCopy> = (0..4)
            .flat_map(|r| (0..4).map(move |c| (r, c)))
            .map(|(r, c)| BoxCopy {
                src: &full,
                src_start: vec![r * n / 4, c * n / 4],
                dst: &cols[c],
                dst_start: vec![r * n / 4, 0],
                shape: vec![n / 4, n / 4],
            })
            .collect();
        be.copy_boxes(&jobs).unwrap();
        be.synchronize().unwrap();
        for (c, col) in cols.iter().enumerate() {
            let got = download(be, col).to_array::<u32>().unwrap();
            for (i, j) in [
                (0, 0),
                (n - 1, n / 4 - 1),
                (123, 45),
                (n / 2 + 1, n / 4 - 2),
            ] {
                assert_eq!(
                    got[[i, j]] as usize,
                    i * n + c * n / 4 + j,
                    "column block {c} at ({i}, {j})"
                );
            }
        }
    });
}

#[test]
fn empty_many_gives_disjoint_writable_tensors() {
    on_every_backend("empty_many_gives_disjoint_writable_tensors", |be| {
        let shapes: [&[usize]; 4] = [&[3, 5], &[0, 2], &[7], &[2, 2]];
        let ts = be.empty_many(&shapes, DType::Float64).unwrap();
        for (k, t) in ts.iter().enumerate() {
            assert_eq!((t.shape(), t.device()), (shapes[k], be.device()));
            assert!(!t.readonly());
            let n = t.numel();
            let vals: Vec<f64> = (0..n).map(|i| (100 * k + i) as f64).collect();
            be.transfer(&Tensor::from_slice(&vals, t.shape()).unwrap(), t)
                .unwrap();
        }
        for (k, t) in ts.iter().enumerate() {
            let got = download(be, t).to_array::<f64>().unwrap();
            for (i, &v) in got.iter().enumerate() {
                assert_eq!(v, (100 * k + i) as f64, "tensor {k}");
            }
        }
    });
}

/// The emulated driver never stands behind `backend_for`: an emulated device is not a device
/// users can reach.
#[test]
fn emulated_devices_are_not_reachable_through_backend_for() {
    #[cfg(feature = "kernel-host-tests")]
    {
        let emu = CudaBackend::emulated(0);
        assert!(is_emulated(emu.device()));
        assert!(backend_for(emu.device()).is_err());
        assert!(CudaBackend::get(emu.device()).is_err());
        // Nor does the real backend take its tensors.
        let t = emu.empty(&[4], DType::Float32).unwrap();
        assert!(dlpart::ops::to_device(&t, Device::CPU).is_err());
    }
    assert!(!is_emulated(Device::cuda(0)));
}

/// 2^62 bytes, a size no device or host can map, is an [`Error::OutOfMemory`] naming the
/// bytes on every backend (a `MemoryError` in Python), never an abort or a driver error.
#[test]
fn an_allocation_the_device_refuses_is_out_of_memory() {
    on_every_backend(
        "an_allocation_the_device_refuses_is_out_of_memory",
        |be| match be.empty(&[1 << 30, 1 << 30], DType::Float32) {
            Err(Error::OutOfMemory { bytes, .. }) => assert_eq!(bytes, 1 << 62),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("2^62 bytes allocated"),
        },
    );
}

/// On a GPU: row blocks of `kDLCUDA:0` partitions on three ranks (rank 1 without any) become
/// column blocks across the ranks, staged through pinned host memory as `ThreadComm` takes
/// host memory only (an MPI that is not CUDA-aware); the staging buffers are then kept for
/// reuse. The emulated devices run the same path with counted allocations in the crate's
/// unit tests (`spmd::tests_staged`).
#[test]
fn an_spmd_exchange_of_gpu_partitions_stages_through_pinned_memory() {
    use dlpart::spmd::{
        from_local, repartition_to, Communicator, LocalParts, SpmdTarget, ThreadComm,
    };
    let Some(gpu) = real_gpu("an_spmd_exchange_of_gpu_partitions_stages_through_pinned_memory")
    else {
        return;
    };
    let whole = iota(&[6, 5]);
    let rows: [(usize, usize, usize); 2] = [(0, 0, 2), (2, 2, 4)]; // (rank, first row, rows)
    gpu.release_staging();
    let results = ThreadComm::run(3, |comm| {
        assert!(!comm.accepts_device(gpu.device()));
        let mine = (rows.iter().filter(|r| r.0 == comm.rank()))
            .map(|&(_, at, n)| {
                let host = whole.view(&[at, 0], &[n, 5]).unwrap();
                (vec![at, 0], upload(gpu.as_ref(), &contiguous_host(&host)))
            })
            .collect();
        let pa = from_local(comm, Ok(LocalParts::Placed(mine)), None).unwrap();
        let target = SpmdTarget {
            grid: Grid::from_splits(&[6, 5], vec![vec![0, 6], vec![0, 1, 3, 5]]).unwrap(),
            owners: vec![0, 1, 2],
            devices: vec![gpu.device(); 3],
        };
        let (out, _) = repartition_to(comm, &pa, target, false).unwrap();
        let p = out
            .partitions()
            .find(|p| p.data.tensor().is_some())
            .unwrap();
        let got = download_f32(gpu.as_ref(), p.data.tensor().unwrap());
        let want = contiguous_host(&whole.view(&p.start, &p.shape).unwrap());
        (
            got,
            want.to_array::<f32>().unwrap().into_raw_vec_and_offset().0,
        )
    });
    for (rank, (got, want)) in results.iter().enumerate() {
        assert_eq!(got, want, "rank {rank}");
    }
    assert!(
        gpu.kept_staging_bytes() > 0,
        "the exchange staged through pinned memory"
    );
    gpu.release_staging();
    assert_eq!(gpu.kept_staging_bytes(), 0);
}

/// On a GPU (and a second one where there is one): row blocks spread over the host and the
/// GPU become column blocks spread over the host and the GPUs, new and into strided targets,
/// with `transfer` (refused without it). The emulated devices run the same paths, with
/// random layouts and injected faults, in the crate's unit tests (`ops::crossing::tests`).
#[test]
fn repartition_with_transfer_moves_boxes_between_the_host_and_gpus() {
    let test = "repartition_with_transfer_moves_boxes_between_the_host_and_gpus";
    let Some(gpu) = real_gpu(test) else {
        return;
    };
    let g0 = gpu.device();
    let g1 = match CudaBackend::get(Device::cuda(1)) {
        Ok(b) => b.device(),
        Err(e) => {
            eprintln!("SKIP {test} on kDLCUDA:1: {e}");
            g0
        }
    };
    let shape = [37, 50];
    let full = iota(&shape);
    let sg = Grid::even(&shape, &[4, 1]).unwrap();
    let dg = Grid::from_splits(&shape, vec![vec![0, 37], vec![0, 3, 4, 29, 50]]).unwrap();
    let plan = Plan::new(&sg, &dg).unwrap();
    let host = backend_for(Device::CPU).unwrap();
    let on = |d: Device| -> Arc<dyn Backend> { backend_for(d).unwrap() };
    let src_devs = [Device::CPU, g0, g1, Device::CPU];
    let src: Vec<Tensor> = (0..sg.num_partitions())
        .map(|i| {
            let r = sg.region_at(i);
            let part = contiguous_host(&full.view(&r.start, &r.shape).unwrap());
            upload(on(src_devs[i]).as_ref(), &part)
        })
        .collect();
    let dst_devs = vec![g1, Device::CPU, g0, g1];
    let e = dlpart::ops::repartition(&plan, &src, &dst_devs, false).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    let out = dlpart::ops::repartition(&plan, &src, &dst_devs, true).unwrap();
    let full_host = full.to_array::<f32>().unwrap();
    let check = |parts: &[Tensor]| {
        for (j, part) in parts.iter().enumerate() {
            let r = dg.region_at(j);
            let got = dlpart::ops::to_device(part, Device::CPU).unwrap();
            let got = got.to_array::<f32>().unwrap();
            let want = full_host.slice_each_axis(|ax| {
                let a = ax.axis.index();
                ndarray::Slice::from(r.start[a]..r.start[a] + r.shape[a])
            });
            assert_eq!(got, want, "target {j} on {}", part.device());
        }
    };
    for (t, d) in out.iter().zip(&dst_devs) {
        assert_eq!(t.device(), *d);
    }
    check(&out);
    // Into reversed views of bigger buffers, on the host and the GPUs in turn.
    let dst: Vec<Tensor> = (0..dg.num_partitions())
        .map(|j| {
            let r = dg.region_at(j);
            let be = if j % 2 == 0 { on(g0) } else { host.clone() };
            let big = upload(
                be.as_ref(),
                &Tensor::zeros(&[39, r.shape[1]], DType::Float32).unwrap(),
            );
            reversed(&big.view(&[1, 0], &r.shape).unwrap(), 0)
        })
        .collect();
    dlpart::ops::repartition_into(&plan, &src, &dst, true).unwrap();
    check(&dst);
}
