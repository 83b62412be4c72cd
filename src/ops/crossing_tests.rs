//! Repartitions across devices in one process (`transfer = true`), over emulated CUDA devices
//! (feature `kernel-host-tests`), which this crate's unit tests reach through `backend_for`:
//! random layouts with partitions spread over host memory and two or three GPUs, in both
//! directions, against ndarray references; the refusal without `transfer`; and failures
//! (no kernels for a device, an allocation or a copy the driver fails, a claim held by a
//! view) that must leave every target as it was.

use ndarray::{ArrayD, IxDyn, Slice};

use super::super::{repartition, repartition_into, to_device};
use crate::backend::cuda::{CudaBackend, EmulatedCall};
use crate::backend::Backend;
use crate::grid::{Grid, Region};
use crate::tensor::Element;
use crate::test_rng::Rng;
use crate::{DType, Device, DeviceType, Error, Layout, PartitionedArray, Plan, Tensor};

/// Emulated device `n`. Devices 0 and 1 read each other's memory (a transfer between them is
/// a kernel reading across); 97 reaches neither (transfers staged through pinned memory).
/// The fault tests have devices of their own (90 and up), so that no other test meets their
/// faults.
fn emu(n: u32) -> Device {
    CudaBackend::emulated(n).device()
}

/// JAX's emulated second host device: host memory of another id, one memory with `kDLCPU`.
fn cpu1() -> Device {
    crate::backend::note_host_devices(2);
    Device::new(DeviceType::Cpu, 1).unwrap()
}

/// dlpart's own rule, written out: data moves between `a` and `b` without a transfer when
/// they are one device or both host memory.
fn one_memory(a: Device, b: Device) -> bool {
    a == b || (a.is_host_accessible() && b.is_host_accessible())
}

fn random_grid(rng: &mut Rng, shape: &[usize]) -> Grid {
    let splits = shape
        .iter()
        .map(|&n| {
            let mut pts: Vec<usize> = (0..rng.below(3)).map(|_| rng.below(n + 1)).collect();
            pts.extend([0, n]);
            pts.sort_unstable();
            pts
        })
        .collect();
    Grid::from_splits(shape, splits).unwrap()
}

fn slice_of<T: Clone>(a: &ArrayD<T>, r: &Region) -> ArrayD<T> {
    a.slice_each_axis(|ax| {
        let i = ax.axis.index();
        Slice::from(r.start[i]..r.start[i] + r.shape[i])
    })
    .to_owned()
}

/// `t`'s elements, read on the host.
fn values<T: Element>(t: &Tensor) -> ArrayD<T> {
    to_device(t, Device::CPU).unwrap().to_array::<T>().unwrap()
}

/// Whether some element goes between a source and a target partition that are not one memory.
fn crosses(sg: &Grid, src: &[Device], dg: &Grid, dst: &[Device]) -> bool {
    (0..src.len()).any(|i| {
        let r = sg.region_at(i);
        (0..dst.len()).any(|j| {
            let q = dg.region_at(j);
            let meet = (0..r.start.len()).all(|a| {
                r.start[a].max(q.start[a]) < (r.start[a] + r.shape[a]).min(q.start[a] + q.shape[a])
            });
            meet && !one_memory(src[i], dst[j])
        })
    })
}

/// The source partitions of `whole` (host) over `grid` on `devices`: host views of it
/// (strided), or copies on the device; on a GPU, half the time a view of a copy of the whole
/// array there (strided device memory).
fn sources(rng: &mut Rng, whole: &Tensor, grid: &Grid, devices: &[Device]) -> Vec<Tensor> {
    let mut there: Vec<(Device, Tensor)> = Vec::new();
    (0..grid.num_partitions())
        .map(|i| {
            let r = grid.region_at(i);
            let view = whole.view(&r.start, &r.shape).unwrap();
            match devices[i] {
                Device::CPU => view,
                d if d.kind == DeviceType::Cuda && rng.below(2) == 0 => {
                    let at = there.iter().position(|(e, _)| *e == d).unwrap_or_else(|| {
                        there.push((d, to_device(whole, d).unwrap()));
                        there.len() - 1
                    });
                    there[at].1.view(&r.start, &r.shape).unwrap()
                }
                d => to_device(&view, d).unwrap(),
            }
        })
        .collect()
}

/// One array of `T` (of random values from `draw`) on a random layout with partitions on
/// random devices of `pool`, repartitioned to another such layout, new and into views of one
/// array per device.
fn random_case<T: Element + Copy + PartialEq + std::fmt::Debug>(
    rng: &mut Rng,
    case: usize,
    pool: &[Device],
    sentinel: T,
    draw: fn(u64) -> T,
) {
    let shape: Vec<usize> = (0..1 + rng.below(3)).map(|_| rng.below(8)).collect();
    let a = ArrayD::from_shape_fn(IxDyn(&shape), |_| draw(rng.next()));
    let whole = Tensor::from_ndarray(a.clone());
    let (sg, dg) = (random_grid(rng, &shape), random_grid(rng, &shape));
    let pick = |rng: &mut Rng, n: usize| -> Vec<Device> {
        (0..n).map(|_| pool[rng.below(pool.len())]).collect()
    };
    let (src_devs, dst_devs) = (
        pick(rng, sg.num_partitions()),
        pick(rng, dg.num_partitions()),
    );
    let src = sources(rng, &whole, &sg, &src_devs);
    let plan = Plan::new(&sg, &dg).unwrap();
    let crossing = crosses(&sg, &src_devs, &dg, &dst_devs);
    let what = format!("case {case}: {shape:?} {sg:?} {src_devs:?} -> {dg:?} {dst_devs:?}");

    let check = |out: &[Tensor]| {
        for (j, t) in out.iter().enumerate() {
            assert_eq!(t.device(), dst_devs[j], "{what}: target {j}");
            let want = slice_of(&a, &dg.region_at(j));
            assert_eq!(values::<T>(t), want, "{what}: target {j}");
        }
    };
    match repartition(&plan, &src, &dst_devs, false) {
        Err(Error::DeviceMismatch { .. }) if crossing => {}
        Ok(out) if !crossing => check(&out),
        other => panic!("{what}: without transfer: {other:?}"),
    }
    check(&repartition(&plan, &src, &dst_devs, true).unwrap());

    // Into views of one array per target device, every element `sentinel` at first: the
    // regions of the targets there are written, and nothing else.
    let mut canvases: Vec<(Device, Tensor)> = Vec::new();
    for &d in &dst_devs {
        if !canvases.iter().any(|(e, _)| *e == d) {
            let blank = Tensor::from_ndarray(ArrayD::from_elem(IxDyn(&shape), sentinel));
            canvases.push((d, to_device(&blank, d).unwrap()));
        }
    }
    let canvas = |d: Device| &canvases.iter().find(|(e, _)| *e == d).unwrap().1;
    let dst: Vec<Tensor> = (0..dg.num_partitions())
        .map(|j| {
            let r = dg.region_at(j);
            canvas(dst_devs[j]).view(&r.start, &r.shape).unwrap()
        })
        .collect();
    let expect = |written: bool| {
        for (d, c) in &canvases {
            let mut want = ArrayD::from_elem(IxDyn(&shape), sentinel);
            for j in (0..dst.len()).filter(|&j| written && dst_devs[j] == *d) {
                let r = dg.region_at(j);
                want.slice_each_axis_mut(|ax| {
                    let i = ax.axis.index();
                    Slice::from(r.start[i]..r.start[i] + r.shape[i])
                })
                .assign(&slice_of(&a, &r));
            }
            assert_eq!(values::<T>(c), want, "{what}: the array on {d}");
        }
    };
    match repartition_into(&plan, &src, &dst, false) {
        Err(Error::DeviceMismatch { .. }) if crossing => expect(false),
        Ok(()) if !crossing => expect(true),
        other => panic!("{what}: into, without transfer: {other:?}"),
    }
    repartition_into(&plan, &src, &dst, true).unwrap();
    expect(true);
}

#[test]
fn repartitions_across_devices_with_transfer_match_ndarray_on_random_layouts() {
    let pool = [Device::CPU, cpu1(), emu(0), emu(1), emu(97)];
    let mut rng = Rng(0x5eed_c0de);
    for case in 0..240 {
        match case % 3 {
            0 => random_case::<i64>(&mut rng, case, &pool, -1, |x| (x >> 20) as i64),
            1 => random_case::<i16>(&mut rng, case, &pool, -1, |x| (x >> 48) as i16),
            _ => random_case::<u8>(&mut rng, case, &pool, 0xee, |x| (x >> 56) as u8 & 0x7f),
        }
    }
}

/// A 6 x 4 array of `10 * row + column`.
fn reference() -> ArrayD<i32> {
    ArrayD::from_shape_fn(IxDyn(&[6, 4]), |ix| (10 * ix[0] + ix[1]) as i32)
}

/// Row blocks on a GPU then the host, through `PartitionedArray`: repartitioned into column
/// blocks on the host, the other GPU and the first one; back into the caller's row blocks
/// on the host; refused without `transfer`, naming the moves.
#[test]
fn partitioned_arrays_repartition_between_host_and_gpus_with_transfer() {
    let a = reference();
    let (g0, g1) = (emu(0), emu(1));
    let rows =
        PartitionedArray::partition(&Tensor::from_ndarray(a.clone()), &Layout::tiling(&[2, 1]))
            .unwrap();
    let moved: Vec<Tensor> = [g0, Device::CPU]
        .iter()
        .zip(rows.tensors().unwrap())
        .map(|(&d, t)| to_device(t, d).unwrap())
        .collect();
    let rows = PartitionedArray::from_tensors_unchecked(rows.grid().clone(), moved, DType::Int32);
    let layout = Layout::tiling(&[1, 3]).devices(vec![Device::CPU, g1, g0]);
    let e = rows.repartition(&layout, false).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e:?}");
    let text = e.to_string();
    for moved in [
        "kDLCPU -> kDLCUDA:1001",
        "kDLCUDA:1000 -> kDLCPU",
        "transfer=True",
    ] {
        assert!(text.contains(moved), "{text}");
    }
    let cols = rows.repartition(&layout, true).unwrap();
    assert_eq!(cols.devices(), vec![Device::CPU, g1, g0]);
    let whole = cols.assemble(Some(Device::CPU), true).unwrap();
    assert_eq!(whole.to_array::<i32>().unwrap(), a);
    for (j, cut) in [(0, 0..2), (1, 2..3), (2, 3..4)] {
        let t = cols.tensors().unwrap()[j].clone();
        let want = a.slice(ndarray::s![.., cut]).to_owned().into_dyn();
        assert_eq!(values::<i32>(&t), want, "column block {j}");
    }
    let back = Tensor::zeros(&[6, 4], DType::Int32).unwrap();
    let into = PartitionedArray::partition(&back, &Layout::tiling(&[2, 1])).unwrap();
    let e = cols.repartition_into(&into, false).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e:?}");
    assert_eq!(
        back.to_array::<i32>().unwrap(),
        ArrayD::<i32>::zeros(IxDyn(&[6, 4]))
    );
    cols.repartition_into(&into, true).unwrap();
    assert_eq!(back.to_array::<i32>().unwrap(), a);
}

/// `t`'s memory and layout under the label `device`, for a device no backend here serves.
fn labelled(t: &Tensor, device: Device) -> Tensor {
    // SAFETY: the tests below only pass it where it is refused before any access.
    unsafe { t.labelled(device) }
}

/// The source of the fault tests: rows 0..3 of [`reference`] on the host, rows 3..6 on `gpu`;
/// the plan into two column blocks.
fn rows_on(gpu: Device) -> (Plan, Vec<Tensor>) {
    let a = Tensor::from_ndarray(reference());
    let sg = Grid::from_splits(&[6, 4], vec![vec![0, 3, 6], vec![0, 4]]).unwrap();
    let dg = Grid::from_splits(&[6, 4], vec![vec![0, 6], vec![0, 2, 4]]).unwrap();
    let src = vec![
        a.view(&[0, 0], &[3, 4]).unwrap(),
        to_device(&a.view(&[3, 0], &[3, 4]).unwrap(), gpu).unwrap(),
    ];
    (Plan::new(&sg, &dg).unwrap(), src)
}

/// A 6 x 2 block of -1 on `device`.
fn blank(device: Device) -> Tensor {
    to_device(&Tensor::from_slice(&[-1i32; 12], &[6, 2]).unwrap(), device).unwrap()
}

fn untouched(t: &Tensor) -> bool {
    values::<i32>(t).iter().all(|&x| x == -1)
}

/// `into`, the targets of [`rows_on`]'s plan, hold the column blocks 0..2 and 2..4 of
/// [`reference`].
fn expect_column_blocks(into: &[Tensor]) {
    let a = reference();
    assert_eq!(
        values::<i32>(&into[0]),
        a.slice(ndarray::s![.., 0..2]).to_owned().into_dyn()
    );
    assert_eq!(
        values::<i32>(&into[1]),
        a.slice(ndarray::s![.., 2..4]).to_owned().into_dyn()
    );
}

#[test]
fn a_device_without_kernels_is_refused_before_any_target_is_written() {
    let gpu = emu(90);
    let (plan, src) = rows_on(gpu);
    let one_api = Device::new(DeviceType::OneApi, 0).unwrap();
    let host = blank(Device::CPU);
    let backing = blank(Device::CPU);
    let elsewhere = labelled(&backing, one_api);
    let into = [host.clone(), elsewhere.clone()];
    let e = repartition_into(&plan, &src, &into, true).unwrap_err();
    assert!(matches!(e, Error::BackendUnavailable { .. }), "{e:?}");
    assert!(e.to_string().contains("kDLOneAPI:0"), "{e}");
    assert!(untouched(&host) && untouched(&backing));
    // A GPU target and a source there: the same.
    let on_gpu = blank(gpu);
    let e = repartition_into(&plan, &src, &[on_gpu.clone(), elsewhere.clone()], true);
    assert!(matches!(e, Err(Error::BackendUnavailable { .. })), "{e:?}");
    let src_there = [src[0].clone(), labelled(&src[0], one_api)];
    let e = repartition_into(&plan, &src_there, &[host.clone(), on_gpu.clone()], true);
    assert!(matches!(e, Err(Error::BackendUnavailable { .. })), "{e:?}");
    assert!(untouched(&host) && untouched(&on_gpu) && untouched(&backing));
    let e = repartition(&plan, &src, &[Device::CPU, one_api], true).unwrap_err();
    assert!(matches!(e, Error::BackendUnavailable { .. }), "{e:?}");
}

/// Each call the driver can fail that the crossings cannot do without, made to fail once on
/// the GPU of a repartition whose bytes cross both ways (host rows into the GPU's column
/// block, GPU rows into the host's): an error naming the call, and neither target written,
/// also when the first pair's bytes had already arrived; the same repartition then goes
/// through, and every pinned buffer it took is freed once. (A failed pinned allocation is
/// not one of them: see the next test.)
#[test]
fn a_failing_allocation_or_transfer_leaves_every_target_as_it_was() {
    let faults = [
        (91, EmulatedCall::Alloc, 0, "cuMemAlloc"),
        (93, EmulatedCall::CopyHtod, 0, "cuMemcpyHtoDAsync"),
        (94, EmulatedCall::CopyHtod, 1, "cuMemcpyHtoDAsync"),
        (95, EmulatedCall::CopyDtoh, 0, "cuMemcpyDtoHAsync"),
    ];
    for (n, call, skip, named) in faults {
        let be = CudaBackend::emulated(n);
        let gpu = be.device();
        let (plan, src) = rows_on(gpu);
        // Once through first, for the device's job-table scratch (pinned memory it keeps).
        repartition(&plan, &src, &[gpu, Device::CPU], true).unwrap();
        // Column block 0 on the GPU (from both row blocks), block 1 on the host.
        let into = [blank(gpu), blank(Device::CPU)];
        be.release_staging();
        let before = be.emulated_pinned();
        be.fail_emulated(call, skip);
        let e = repartition_into(&plan, &src, &into, true).unwrap_err();
        assert!(be.emulated_faults_spent(), "{call:?} {skip}: {e}");
        assert!(e.to_string().contains(named), "{call:?} {skip}: {e}");
        assert!(
            into.iter().all(untouched),
            "{call:?} {skip}: a target was written"
        );
        be.fail_emulated(call, skip);
        let e = repartition(&plan, &src, &[gpu, Device::CPU], true).unwrap_err();
        assert!(e.to_string().contains(named), "{call:?} {skip}: {e}");
        assert!(be.emulated_faults_spent());
        repartition_into(&plan, &src, &into, true).unwrap();
        expect_column_blocks(&into);
        be.release_staging();
        let now = be.emulated_pinned();
        assert_eq!(
            now.allocs - before.allocs,
            now.frees - before.frees,
            "{call:?}"
        );
        assert_eq!(now.live_bytes, before.live_bytes, "{call:?}");
    }
}

/// A pinned staging buffer that cannot be had (`cuMemAllocHost` fails, or the device has no
/// pinned memory left) is ordinary host memory instead, by the one staging policy: the
/// repartition goes through, both ways, and takes no pinned memory.
#[test]
fn crossings_without_pinned_memory_stage_through_ordinary_host_memory() {
    let be = CudaBackend::emulated(92);
    let gpu = be.device();
    let (plan, src) = rows_on(gpu);
    // Once through first, for the device's job-table scratch (pinned memory it keeps).
    repartition(&plan, &src, &[gpu, Device::CPU], true).unwrap();
    be.release_staging();
    for limited in [false, true] {
        let before = be.emulated_pinned();
        match limited {
            false => be.fail_emulated(EmulatedCall::AllocPinned, 0),
            true => be.set_emulated_pinned_limit(before.live_bytes),
        }
        let into = [blank(gpu), blank(Device::CPU)];
        repartition_into(&plan, &src, &into, true).unwrap();
        assert!(be.emulated_faults_spent(), "limited: {limited}");
        expect_column_blocks(&into);
        let now = be.emulated_pinned();
        if limited {
            // Not one pinned allocation: both sides' host buffers are pageable.
            assert_eq!(now.allocs, before.allocs);
        }
        be.set_emulated_pinned_limit(usize::MAX);
        be.release_staging();
        assert_eq!(be.emulated_pinned().live_bytes, before.live_bytes);
    }
}

/// A target another holder is reading (a live view) is refused before any target is written,
/// also where the targets' copies run in several batches (the `kDLCPU` target's from the
/// GPU, then the `kDLCPU:1` target's from `kDLCPU:1`): every host target is claimed before
/// the first copy.
#[test]
fn a_target_held_by_a_view_is_refused_before_any_target_is_written() {
    let gpu = emu(96);
    let a = Tensor::from_ndarray(reference());
    let sg = Grid::from_splits(&[6, 4], vec![vec![0, 3, 6], vec![0, 4]]).unwrap();
    let src = vec![
        to_device(&a.view(&[0, 0], &[3, 4]).unwrap(), gpu).unwrap(),
        to_device(&a.view(&[3, 0], &[3, 4]).unwrap(), cpu1()).unwrap(),
    ];
    let plan = Plan::new(&sg, &sg).unwrap();
    // Rows 0..3 from the GPU into kDLCPU memory, rows 3..6 between kDLCPU:1 tensors.
    let blank_rows =
        |d: Device| to_device(&Tensor::from_slice(&[-1i32; 12], &[3, 4]).unwrap(), d).unwrap();
    let into = [blank_rows(Device::CPU), blank_rows(cpu1())];
    let view = into[1].as_array::<i32>().unwrap();
    let e = repartition_into(&plan, &src, &into, true).unwrap_err();
    assert!(matches!(e, Error::Buffer { .. }), "{e:?}");
    drop(view);
    assert!(into.iter().all(untouched), "a target was written: {e}");
    assert!(e.to_string().contains("target partition 1"), "{e}");
    repartition_into(&plan, &src, &into, true).unwrap();
    assert_eq!(
        values::<i32>(&into[0]),
        reference()
            .slice(ndarray::s![0..3, ..])
            .to_owned()
            .into_dyn()
    );
}

/// The same where nothing crosses devices but the copies still run in several batches (each
/// box stays in its memory: kDLCPU, kDLCPU:1 and a GPU; the kDLCPU batch runs first): a held
/// `kDLCPU:1` target is refused before the `kDLCPU` one is written.
#[test]
fn a_target_held_by_a_view_is_refused_before_any_batch_runs_without_crossings() {
    let gpu = emu(88);
    let a = Tensor::from_ndarray(reference());
    let sg = Grid::from_splits(&[6, 4], vec![vec![0, 2, 4, 6], vec![0, 4]]).unwrap();
    let devices = [Device::CPU, cpu1(), gpu];
    let rows = |i: usize| a.view(&[2 * i, 0], &[2, 4]).unwrap();
    let src: Vec<Tensor> = (0..3)
        .map(|i| to_device(&rows(i), devices[i]).unwrap())
        .collect();
    let plan = Plan::new(&sg, &sg).unwrap();
    let blank_rows =
        |d: Device| to_device(&Tensor::from_slice(&[-1i32; 8], &[2, 4]).unwrap(), d).unwrap();
    let into: Vec<Tensor> = devices.iter().map(|&d| blank_rows(d)).collect();
    let view = into[1].as_array::<i32>().unwrap();
    let e = repartition_into(&plan, &src, &into, false).unwrap_err();
    assert!(matches!(e, Error::Buffer { .. }), "{e:?}");
    drop(view);
    assert!(into.iter().all(untouched), "a target was written: {e}");
    repartition_into(&plan, &src, &into, false).unwrap();
    for (i, t) in into.iter().enumerate() {
        let want = reference()
            .slice(ndarray::s![2 * i..2 * i + 2, ..])
            .to_owned();
        assert_eq!(values::<i32>(t), want.into_dyn(), "target {i}");
    }
}

/// A pair whose host side is beyond what the device's cache keeps for reuse goes through
/// ordinary `kDLCPU` memory, both ways, and takes no pinned memory: each box arrives as the
/// source holds it.
#[test]
fn crossings_beyond_the_pinned_cache_go_through_ordinary_host_memory() {
    let be = CudaBackend::emulated(89);
    let gpu = be.device();
    let (plan, src) = rows_on(gpu);
    let srcs: Vec<&Tensor> = src.iter().collect();
    let targets = [gpu, Device::CPU];
    let backends = super::super::check_devices(&plan, &src, &targets, DType::Int32, true).unwrap();
    let dst = [blank(gpu), blank(Device::CPU)];
    let dsts: Vec<&Tensor> = dst.iter().collect();
    // Once through first, for the device's job-table scratch (pinned memory it keeps).
    let crossings = super::Crossings::of(&plan, &srcs, &dsts, |_| {});
    crossings.send(|i| srcs[i], &backends).unwrap();
    be.release_staging();
    let before = be.emulated_pinned();
    let crossings = super::Crossings::of(&plan, &srcs, &dsts, |_| {}).pinned_up_to(0);
    let arrived = crossings.send(|i| srcs[i], &backends).unwrap();
    assert_eq!(
        be.emulated_pinned().allocs,
        before.allocs,
        "no pinned memory"
    );
    let a = reference();
    let mut seen = Vec::new();
    for (view, op) in &arrived {
        let r = plan.src_grid().region_at(op.src);
        let at: Vec<usize> = (0..2).map(|k| r.start[k] + op.src_start[k]).collect();
        let want = a
            .slice(ndarray::s![
                at[0]..at[0] + op.shape[0],
                at[1]..at[1] + op.shape[1]
            ])
            .to_owned()
            .into_dyn();
        assert_eq!(values::<i32>(view), want, "the box from {at:?}");
        let side = dst[op.dst].device();
        let expected = if side == gpu { gpu } else { Device::CPU };
        assert_eq!(view.device(), expected, "the box from {at:?}");
        seen.push((op.src, op.dst));
    }
    seen.sort_unstable();
    // Host rows into the GPU's column block, GPU rows into the host's.
    assert_eq!(seen, vec![(0, 0), (1, 1)]);
}

/// `assemble` with `transfer` over random layouts with partitions on random devices of
/// `pool`, onto each device of the pool: the array, as ndarray holds it; without `transfer`,
/// refused exactly when a partition is not in the target's memory.
#[test]
fn assemble_with_transfer_matches_ndarray_on_random_layouts() {
    let pool = [Device::CPU, cpu1(), emu(0), emu(1), emu(97)];
    let mut rng = Rng(0xa55e_b1e5);
    for case in 0..120 {
        let shape: Vec<usize> = (0..1 + rng.below(3)).map(|_| rng.below(7)).collect();
        let a = ArrayD::from_shape_fn(IxDyn(&shape), |_| (rng.next() >> 40) as i32);
        let whole = Tensor::from_ndarray(a.clone());
        let grid = random_grid(&mut rng, &shape);
        let devs: Vec<Device> = (0..grid.num_partitions())
            .map(|_| pool[rng.below(pool.len())])
            .collect();
        let src = sources(&mut rng, &whole, &grid, &devs);
        let pa = PartitionedArray::from_tensors_unchecked(grid.clone(), src, DType::Int32);
        for &target in &pool {
            let what = format!("case {case}: {shape:?} {grid:?} {devs:?} -> {target}");
            let got = pa.assemble(Some(target), true).unwrap();
            assert_eq!(got.device(), target, "{what}");
            assert_eq!(values::<i32>(&got), a, "{what}");
            let away = devs.iter().any(|&d| !one_memory(d, target));
            match pa.assemble(Some(target), false) {
                Err(Error::DeviceMismatch { .. }) if away => {}
                Ok(t) if !away => assert_eq!(values::<i32>(&t), a, "{what}"),
                other => panic!("{what}: without transfer: {other:?}"),
            }
        }
    }
}

/// The partitions of `a` (6 x 4) over row blocks of two rows and column blocks of two, on
/// the devices `on` names, in C order of positions.
fn blocks_on(a: &ArrayD<i32>, on: &dyn Fn(usize) -> Device) -> PartitionedArray {
    let whole = Tensor::from_ndarray(a.clone());
    let grid = Grid::from_splits(&[6, 4], vec![vec![0, 2, 4, 6], vec![0, 2, 4]]).unwrap();
    let parts = (0..grid.num_partitions())
        .map(|i| {
            let r = grid.region_at(i);
            to_device(&whole.view(&r.start, &r.shape).unwrap(), on(i)).unwrap()
        })
        .collect();
    PartitionedArray::from_tensors_unchecked(grid, parts, DType::Int32)
}

/// Assembled onto the host, a GPU's partitions cross in one copy of their bytes, however many
/// partitions there are (the bus carries the partitions' elements once, packed), and the
/// host's own partitions do not cross at all.
#[test]
fn assemble_moves_a_gpus_partitions_in_one_transfer_of_their_bytes() {
    let be = CudaBackend::emulated(81);
    let gpu = be.device();
    let a = reference();
    // Every partition on the GPU, then every other one.
    for (on_gpu, parts) in [
        (6, blocks_on(&a, &|_| gpu)),
        (
            3,
            blocks_on(&a, &|i| {
                if i % 2 == 0 {
                    gpu
                } else {
                    Device::CPU
                }
            }),
        ),
    ] {
        let before = be.emulated_copies();
        let got = parts.assemble(Some(Device::CPU), true).unwrap();
        let now = be.emulated_copies();
        assert_eq!(got.to_array::<i32>().unwrap(), a);
        // Each partition is 2 x 2 int32: 16 bytes.
        assert_eq!(
            (now.dtoh - before.dtoh, now.dtoh_bytes - before.dtoh_bytes),
            (1, 16 * on_gpu),
            "{on_gpu} partitions on the GPU"
        );
    }
}

/// A copy the driver fails while the partitions cross is the assemble's error, naming the
/// call; the partitions are as they were, every pinned buffer taken is back, and the same
/// assemble then goes through.
#[test]
fn assemble_with_a_failing_transfer_returns_the_error_and_leaves_the_partitions() {
    let be = CudaBackend::emulated(82);
    let gpu = be.device();
    let a = reference();
    let parts = blocks_on(&a, &|i| if i < 3 { gpu } else { Device::CPU });
    // Once through first, for the device's job-table scratch (pinned memory it keeps).
    parts.assemble(Some(Device::CPU), true).unwrap();
    parts.assemble(Some(gpu), true).unwrap();
    for (call, target, named) in [
        (EmulatedCall::CopyDtoh, Device::CPU, "cuMemcpyDtoHAsync"),
        (EmulatedCall::CopyHtod, gpu, "cuMemcpyHtoDAsync"),
        (EmulatedCall::Alloc, gpu, "cuMemAlloc"),
    ] {
        be.release_staging();
        let before = be.emulated_pinned();
        be.fail_emulated(call, 0);
        let e = parts.assemble(Some(target), true).unwrap_err();
        assert!(be.emulated_faults_spent(), "{call:?}: {e}");
        assert!(e.to_string().contains(named), "{call:?}: {e}");
        let grid = parts.grid().clone();
        for (i, t) in parts.tensors().unwrap().iter().enumerate() {
            let r = grid.region_at(i);
            let want = a
                .slice(ndarray::s![
                    r.start[0]..r.start[0] + 2,
                    r.start[1]..r.start[1] + 2
                ])
                .to_owned()
                .into_dyn();
            assert_eq!(values::<i32>(t), want, "{call:?}: partition {i}");
        }
        be.release_staging();
        assert_eq!(
            be.emulated_pinned().live_bytes,
            before.live_bytes,
            "{call:?}"
        );
        let got = parts.assemble(Some(target), true).unwrap();
        assert_eq!(values::<i32>(&got), a, "{call:?}");
    }
}
