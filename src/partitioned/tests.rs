use super::*;
use crate::device::DeviceType;
use crate::layout::Layout;
use ndarray::{s, ArrayD, IxDyn};

fn invariants(e: &Error) -> Vec<(String, Option<Vec<usize>>, u8)> {
    match e {
        Error::ProtocolMany { errors } => errors.iter().flat_map(invariants).collect(),
        Error::Protocol {
            key,
            position,
            invariant,
            ..
        } => {
            vec![(
                key.clone(),
                position.as_ref().map(|p| p.0.clone()),
                invariant.unwrap_or(0),
            )]
        }
        other => panic!("not a protocol error: {other}"),
    }
}

fn global(shape: &[usize]) -> (Tensor, ArrayD<i32>) {
    let n: usize = shape.iter().product();
    let vals: Vec<i32> = (0..n as i32).collect();
    let t = Tensor::from_slice(&vals, shape).unwrap();
    let a = ArrayD::from_shape_vec(IxDyn(shape), vals).unwrap();
    (t, a)
}

fn me() -> i64 {
    i64::from(std::process::id())
}

#[test]
fn from_tensor_makes_views_matching_ndarray_slices() {
    let (t, a) = global(&[7, 5]);
    let pa = PartitionedArray::partition(&t, &Layout::tiling(&[3, 2])).unwrap();
    assert_eq!(pa.len(), 6);
    // array_split(7, 3) = 3, 2, 2; array_split(5, 2) = 3, 2.
    let rows = [0..3, 3..5, 5..7];
    let cols = [0..3, 3..5];
    for p in pa.partitions() {
        let (r, c) = (rows[p.position[0]].clone(), cols[p.position[1]].clone());
        let expect = a.slice(s![r, c]).into_dyn().to_owned();
        let view = p.tensor().unwrap();
        assert_eq!(view.to_array::<i32>().unwrap(), expect, "{:?}", p.position);
        assert!(std::sync::Arc::ptr_eq(view.owner(), t.owner()));
    }
    assert_eq!(pa.devices(), vec![Device::CPU]);
    assert_eq!(pa.dtype(), Some(DType::Int32));
    let locs: Vec<Vec<Location>> = vec![Vec::new(); 6];
    let data = pa.data().to_vec();
    assert!(PartitionedArray::new(pa.grid().clone(), data, locs, None).is_ok());
    assert!(PartitionedArray::from_tensor(&t, Grid::even(&[5, 7], &[1, 1]).unwrap()).is_err());
    let moved = Layout::tiling(&[1, 1]).on(Device::cuda(0));
    assert!(PartitionedArray::partition(&t, &moved).is_err());
}

#[test]
fn new_reports_dtype_shape_device_and_locals_violations() {
    let (t, _) = global(&[4, 4]);
    let grid = Grid::even(&[4, 4], &[2, 2]).unwrap();
    let pa = PartitionedArray::from_tensor(&t, grid.clone()).unwrap();
    let mut data = pa.data().to_vec();
    let mut locs: Vec<Vec<Location>> = vec![Vec::new(); 4];
    data[1] = Data::Tensor(Tensor::zeros(&[2, 2], DType::Float32).unwrap());
    data[2] = Data::Tensor(t.view(&[0, 0], &[2, 3]).unwrap());
    locs[3] = vec![Location::new("1.1.1.1", me(), Device::cuda(0))];
    // Another process's location may name another device: it describes the original.
    locs[0] = vec![Location::new("1.1.1.1", me() + 1, Device::cuda(0))];
    let locals = vec![vec![1, 1], vec![2, 0], vec![1, 1], vec![0]];
    let e = PartitionedArray::new(grid, data, locs, Some(locals)).unwrap_err();
    let expect: Vec<(String, Option<Vec<usize>>, u8)> = vec![
        ("partitions".into(), Some(vec![0, 1]), 6),
        ("partitions".into(), Some(vec![1, 0]), 7),
        ("location".into(), Some(vec![1, 1]), 9),
        ("locals".into(), None, 10),
        ("locals".into(), Some(vec![1, 1]), 10),
        ("locals".into(), None, 1),
    ];
    assert_eq!(invariants(&e), expect, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("float32 differs from int32 of partition (0, 0)"),
        "{msg}"
    );
    assert!(
        msg.contains("kDLCPU but the locations in this process name kDLCUDA:0"),
        "{msg}"
    );
}

#[test]
fn new_refuses_wrong_counts() {
    let grid = Grid::even(&[4], &[2]).unwrap();
    let e = PartitionedArray::new(grid.clone(), vec![Data::Remote], vec![vec![]; 2], None);
    assert_eq!(
        invariants(&e.unwrap_err()),
        vec![("partitions".into(), None, 2)]
    );
    let e = PartitionedArray::new(grid, vec![Data::Remote; 2], vec![vec![]; 3], None);
    assert_eq!(
        invariants(&e.unwrap_err()),
        vec![("location".into(), None, 2)]
    );
}

#[test]
fn locations_print_like_python_tuples_and_parse_devices() {
    let l = Location::new("1.1.1.1", 7755737, Device::cuda(0));
    assert_eq!(l.to_string(), "('1.1.1.1', 7755737, 'kDLCUDA:0')");
    assert_eq!(
        Location::rank(3, Device::CPU).to_string(),
        "(None, None, 'kDLCPU', rank=3)"
    );
    let odd = Location::new("it's\\", 1, Device::CPU);
    assert_eq!(odd.to_string(), r"('it\'s\\', 1, 'kDLCPU')");
    let one_api = Location::parse_device("kDLOneAPI:1", &[0]).unwrap();
    assert_eq!(one_api.kind, DeviceType::OneApi);
    let e = Location::parse_device("cuda:0", &[2, 1]).unwrap_err();
    assert_eq!(
        invariants(&e),
        vec![("location".into(), Some(vec![2, 1]), 8)]
    );
    assert!(e.to_string().contains("\"cuda:0\""), "{e}");
}

fn remote_and_handle() -> PartitionedArray {
    let grid = Grid::even(&[4], &[2]).unwrap();
    let data = vec![Data::Handle(Handle::new(7u32)), Data::Remote];
    let locs = vec![
        vec![
            Location::new("a", 1, Device::cuda(1)),
            Location::new("b", 2, Device::cuda(0)),
        ],
        vec![Location::rank(1, Device::CPU)],
    ];
    PartitionedArray::new(grid, data, locs, Some(vec![vec![0]])).unwrap()
}

#[test]
fn devices_list_tensors_then_locations_and_tensors_name_what_is_missing() {
    let pa = remote_and_handle();
    assert_eq!(pa.devices(), vec![Device::cuda(1), Device::CPU]);
    assert_eq!(pa.dtype(), None);
    assert_eq!(pa.locals(), Some(&[vec![0]][..]));
    assert_eq!(pa.at(&[1]).unwrap().start, vec![2]);
    let e = pa.tensors().unwrap_err().to_string();
    assert!(e.contains("(0,)") && e.contains("handle"), "{e}");
    let pa = pa.with_dtype(DType::Float64).unwrap();
    assert_eq!(pa.dtype(), Some(DType::Float64));
}

#[test]
fn fetch_resolves_handles_and_checks_what_comes_back() {
    let mut pa = remote_and_handle();
    let calls = std::cell::Cell::new(0);
    let bad = pa.fetch(None, |hs| {
        calls.set(calls.get() + 1);
        assert_eq!(hs.len(), 1);
        assert_eq!(hs[0].downcast_ref::<u32>(), Some(&7));
        Ok(vec![Tensor::zeros(&[3], DType::Float32).unwrap()])
    });
    let e = bad.unwrap_err();
    assert_eq!(
        invariants(&e),
        vec![("partitions".into(), Some(vec![0]), 7)]
    );
    assert!(pa.data()[0].handle().is_some(), "unchanged after an error");
    pa.fetch(Some(&[vec![0]]), |_| {
        Ok(vec![Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()])
    })
    .unwrap();
    assert_eq!(pa.dtype(), Some(DType::Float32));
    assert_eq!(pa.pending(None).unwrap(), Vec::<usize>::new());
    pa.fetch(None, |_| panic!("nothing is pending")).unwrap();
    assert_eq!(calls.get(), 1);
}

fn parts_of(pa: &PartitionedArray) -> Vec<(Vec<usize>, ArrayD<i32>)> {
    pa.partitions()
        .map(|p| {
            (
                p.start.clone(),
                p.tensor().unwrap().to_array::<i32>().unwrap(),
            )
        })
        .collect()
}

/// Every partition of `pa` against `a`, the block of it at the partition's start.
pub(super) fn expect_blocks(pa: &PartitionedArray, a: &ArrayD<i32>) {
    for (start, got) in parts_of(pa) {
        let want = a.slice_each_axis(|ax| {
            let i = ax.axis.index();
            ndarray::Slice::from(start[i]..start[i] + got.shape()[i])
        });
        assert_eq!(got, want, "block at {start:?}");
    }
}

#[test]
fn repartition_assemble_and_to_match_ndarray() {
    let (t, a) = global(&[9, 7]);
    let pa = PartitionedArray::partition(&t, &Layout::tiling(&[4, 1])).unwrap();
    for layout in [
        Layout::tiling(&[1, 3]),
        Layout::splits(vec![vec![0, 0, 9], vec![0, 2, 2, 7]]),
        Layout::block_cyclic(&[2, 3], vec![Device::CPU; 4]),
    ] {
        let out = pa.repartition(&layout, false).unwrap();
        expect_blocks(&out, &a);
        assert_eq!(
            out.assemble(None, false)
                .unwrap()
                .to_array::<i32>()
                .unwrap(),
            a
        );
        let back = PartitionedArray::partition(&t, &Layout::tiling(&[2, 2])).unwrap();
        let targets: Vec<Tensor> = back
            .partitions()
            .map(|p| Tensor::zeros(&p.shape, DType::Int32).unwrap())
            .collect();
        let fresh =
            PartitionedArray::from_tensors_unchecked(back.grid().clone(), targets, DType::Int32);
        out.repartition_into(&fresh, false).unwrap();
        expect_blocks(&fresh, &a);
    }
    // A framework's emulated host device (JAX's kDLCPU:1): another device, but host memory,
    // which data reaches by a plain copy, with or without `transfer`.
    crate::backend::note_host_devices(2);
    let host = Device::new(DeviceType::Cpu, 1).unwrap();
    for transfer in [false, true] {
        let moved = pa
            .repartition(&Layout::tiling(&[2, 1]).on(host), transfer)
            .unwrap();
        assert_eq!(moved.devices(), vec![host]);
        expect_blocks(&moved, &a);
        let back = moved.to(Device::CPU).unwrap();
        assert_eq!(back.devices(), vec![Device::CPU]);
        expect_blocks(&back, &a);
        let whole = moved.assemble(Some(Device::CPU), transfer).unwrap();
        assert_eq!(whole.device(), Device::CPU);
        assert_eq!(whole.to_array::<i32>().unwrap(), a);
        let there = pa.assemble(Some(host), transfer).unwrap();
        assert_eq!(there.device(), host);
        assert_eq!(there.to_array::<i32>().unwrap(), a);
    }
    assert_eq!(pa.to(host).unwrap().devices(), vec![host]);
}

/// Complex partitions move whole: 8- and 16-byte items, real and imaginary parts together.
#[test]
fn complex_arrays_repartition_and_assemble_from_rust() {
    use num_complex::Complex;

    fn check<T: crate::tensor::Element + PartialEq + std::fmt::Debug>(z: ndarray::Array2<T>) {
        let a = z.clone().into_dyn();
        let rows = PartitionedArray::partition(&Tensor::from(z), &Layout::tiling(&[3, 1])).unwrap();
        assert_eq!(rows.dtype(), Some(T::DTYPE));
        for layout in [
            Layout::tiling(&[1, 2]),
            Layout::block_cyclic(&[2, 3], vec![Device::CPU; 3]),
        ] {
            let out = rows.repartition(&layout, false).unwrap();
            for p in out.partitions() {
                let (r, c) = (p.start[0], p.start[1]);
                let want = a.slice(s![r..r + p.shape[0], c..c + p.shape[1]]);
                let got = p.tensor().unwrap().as_array::<T>().unwrap();
                assert_eq!(got, want, "block at {:?}", p.start);
            }
            let whole = out.assemble(None, false).unwrap();
            assert_eq!(whole.dtype(), T::DTYPE);
            assert_eq!(whole.as_array::<T>().unwrap(), a);
        }
    }
    // Real and imaginary parts that differ everywhere, so a swap or a half-item shift shows.
    check(ndarray::Array2::from_shape_fn((7, 5), |(i, j)| {
        Complex::new((10 * i + j) as f32, -((i + 100 * j) as f32) - 0.5)
    }));
    check(ndarray::Array2::from_shape_fn((7, 5), |(i, j)| {
        Complex::new(1e200 * (i as f64 + 1.0), (j as f64) - 1e-200)
    }));
}

#[test]
fn new_partitions_go_on_devices_that_exist_here() {
    let (t, _) = global(&[4, 2]);
    let pa = PartitionedArray::partition(&t, &Layout::tiling(&[2, 1])).unwrap();
    let far = Device::new(DeviceType::Cpu, 4000).unwrap();
    let e = pa
        .repartition(&Layout::tiling(&[1, 1]).on(far), true)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidDevice { .. }), "{e}");
    assert!(e.to_string().contains("kDLCPU:4000"), "{e}");
}

#[test]
fn new_memory_is_never_plain_memory_labelled_pinned_or_managed() {
    let (t, a) = global(&[4, 2]);
    let pa = PartitionedArray::partition(&t, &Layout::tiling(&[2, 1])).unwrap();
    // Pinned memory comes from CUDA, where CUDA is; elsewhere asking for it is an error.
    let pinned = Device::new(DeviceType::CudaHost, 0).unwrap();
    match pa.repartition(&Layout::tiling(&[1, 1]).on(pinned), true) {
        Ok(moved) => {
            assert_eq!(moved.devices(), vec![pinned]);
            let back = moved.assemble(Some(Device::CPU), true).unwrap();
            assert_eq!(back.to_array::<i32>().unwrap(), a);
        }
        Err(e) => {
            assert!(matches!(e, Error::BackendUnavailable { .. }), "{e}");
            assert!(e.to_string().contains("new kDLCUDAHost memory"), "{e}");
        }
    }
    // Managed or ROCm host memory dlpart does not allocate: refused before any copy, by
    // repartition and by the copies of partitions already there.
    for kind in [DeviceType::CudaManaged, DeviceType::RocmHost] {
        let device = Device::new(kind, 0).unwrap();
        let e = pa
            .repartition(&Layout::tiling(&[1, 1]).on(device), true)
            .unwrap_err();
        assert!(
            matches!(e, Error::NoNewMemory { device: d, .. } if d == device),
            "{e}"
        );
        assert!(
            e.to_string().contains("repartition onto one of them"),
            "{e}"
        );
        assert!(crate::ops::to_device(&t, device).is_err());
        let e = pa.to(device).unwrap_err();
        assert!(
            e.to_string().contains("name one of them as the target"),
            "{e}"
        );
        // SAFETY: `t`'s eight elements, in C order, relabelled as host memory of `kind`.
        let there = unsafe { view_2x2(&t, [2, 1], device) };
        let e = crate::ops::to_device(&there, there.device()).unwrap_err();
        assert!(e.to_string().contains("cannot allocate new memory"), "{e}");
        // Each operation that would allocate there names its own way out.
        let held = PartitionedArray::partition(&there, &Layout::tiling(&[2, 1])).unwrap();
        let e = held
            .repartition(&Layout::tiling(&[1, 2]), true)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("repartition onto one of them (devices='cpu'"),
            "{e}"
        );
        let e = held.assemble(None, true).unwrap_err();
        assert!(
            e.to_string()
                .contains("assemble onto one of them (device='cpu'"),
            "{e}"
        );
        let idx = Tensor::from_slice(&[1i64], &[1]).unwrap();
        let e = held.gather(&idx, 0, true).unwrap_err();
        assert!(
            e.to_string()
                .contains("copy the data onto one of them first"),
            "{e}"
        );
        // The ways named work, and give the data back.
        let on_cpu = Layout::tiling(&[1, 2]).on(Device::CPU);
        let cols = held.repartition(&on_cpu, true).unwrap();
        assert_eq!(cols.devices(), vec![Device::CPU]);
        let whole = held.assemble(Some(Device::CPU), true).unwrap();
        assert_eq!(
            whole.to_array::<i32>().unwrap(),
            there.to_array::<i32>().unwrap()
        );
        let row = held
            .to(Device::CPU)
            .unwrap()
            .gather(&idx, 0, false)
            .unwrap();
        assert_eq!(
            row.assemble(None, false)
                .unwrap()
                .to_array::<i32>()
                .unwrap(),
            there
                .to_array::<i32>()
                .unwrap()
                .slice(ndarray::s![1..2, ..])
                .into_dyn()
        );
        // Read and copied to kDLCPU, as any host memory.
        let here = crate::ops::to_device(&there, Device::CPU).unwrap();
        assert_eq!(here.device(), Device::CPU);
        assert_eq!(
            here.to_array::<i32>().unwrap(),
            there.to_array::<i32>().unwrap()
        );
    }
}

/// `e` is the BackendUnavailable error of kDLOneAPI:0, named.
fn assert_unavailable(e: Error) {
    assert!(
        matches!(
            &e,
            Error::BackendUnavailable {
                backend: "kDLOneAPI",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("no kernels for kDLOneAPI:0"), "{e}");
}

/// Partitions on a device without dlpart kernels (kDLOneAPI) cannot be moved by dlpart at
/// all: `to`, and a repartition or assemble onto another device, say so (BackendUnavailable)
/// with or without transfer, rather than ask for a transfer that could not run.
#[test]
fn data_on_a_device_without_kernels_is_refused_by_name_not_sent_to_transfer() {
    let (t, _) = global(&[4, 2]);
    let one_api = Device::new(DeviceType::OneApi, 0).unwrap();
    // SAFETY: the 2x2 view covers the first four of `t`'s elements.
    let there = unsafe { view_2x2(&t, [2, 1], one_api) };
    let pa = PartitionedArray::partition(&there, &Layout::tiling(&[2, 1])).unwrap();
    assert_unavailable(pa.to(Device::CPU).unwrap_err());
    for transfer in [false, true] {
        assert_unavailable(pa.assemble(Some(Device::CPU), transfer).unwrap_err());
        let on_cpu = Layout::tiling(&[1, 1]).on(Device::CPU);
        assert_unavailable(pa.repartition(&on_cpu, transfer).unwrap_err());
    }
    // Host data asked onto such a device is refused the same way.
    let host = PartitionedArray::partition(&t, &Layout::tiling(&[2, 1])).unwrap();
    assert_unavailable(host.to(one_api).unwrap_err());
    assert_unavailable(host.assemble(Some(one_api), false).unwrap_err());
}

/// A gather or scatter whose data would cross from or to a device without dlpart kernels
/// says so (BackendUnavailable) with or without transfer, before any other check of the
/// move; nothing is written.
#[test]
fn gather_and_scatter_across_a_device_without_kernels_are_refused_by_name() {
    let one_api = Device::new(DeviceType::OneApi, 0).unwrap();
    let p0 = Tensor::from_slice(&[-7.0f32; 4], &[2, 2]).unwrap();
    let other = Tensor::from_slice(&[-7.0f32; 4], &[2, 2]).unwrap();
    // SAFETY: `other`'s four elements in C order; never read under this label (refused first).
    let p1 = unsafe { view_2x2(&other, [2, 1], one_api) };
    for transfer in [false, true] {
        // Host values into rows 0 (host) and 3 (kDLOneAPI).
        assert_unavailable(scatter_rows_0_and_3(&p0, p1.clone(), transfer).unwrap_err());
        // Rows 0 and 3 gathered onto the device of row 0 (the host).
        let pa = two_row_blocks(&p0, p1.clone());
        let rows = Tensor::from_slice(&[0i64, 3], &[2]).unwrap();
        assert_unavailable(pa.gather(&rows, 0, transfer).unwrap_err());
        // Values on such a device into host partitions.
        let host = PartitionedArray::partition(&p0, &Layout::tiling(&[2, 1])).unwrap();
        let row = Tensor::from_slice(&[1i64], &[1]).unwrap();
        let values = p1.view(&[0, 0], &[1, 2]).unwrap();
        assert_unavailable(host.scatter(&values, &row, 0, transfer).unwrap_err());
    }
    for t in [&p0, &other] {
        assert_eq!(
            t.to_array::<f32>().unwrap().as_slice(),
            Some(&[-7.0; 4][..])
        );
    }
}

/// Host values write partitions in host memory of any kind (pinned, managed, ROCm host
/// memory, an emulated `kDLCPU:k`) in place, as `ops::scatter` writes such a tensor: no
/// move, so no `transfer` asked for. A gather from such a partition into a kDLCPU one needs
/// none either: a copy between kinds of host memory is a plain copy.
#[test]
fn scatter_writes_host_partitions_of_any_kind_from_host_values() {
    let kinds = [
        Device::new(DeviceType::CudaHost, 0).unwrap(),
        Device::new(DeviceType::CudaManaged, 0).unwrap(),
        Device::new(DeviceType::RocmHost, 0).unwrap(),
        Device::new(DeviceType::Cpu, 1).unwrap(),
    ];
    for device in kinds {
        let p0 = Tensor::from_slice(&[-7.0f32; 4], &[2, 2]).unwrap();
        let other = Tensor::from_slice(&[-7.0f32; 4], &[2, 2]).unwrap();
        // SAFETY: `other`'s four elements, in C order, labelled as host memory of `kind`.
        let p1 = unsafe { view_2x2(&other, [2, 1], device) };
        scatter_rows_0_and_3(&p0, p1.clone(), false).unwrap();
        let got = |t: &Tensor| t.to_array::<f32>().unwrap().into_raw_vec_and_offset().0;
        // numpy: a = full((4, 2), -7); a[[0, 3]] = [[1, 2], [3, 4]]
        assert_eq!(got(&p0), vec![1.0, 2.0, -7.0, -7.0], "{device}");
        assert_eq!(got(&other), vec![-7.0, -7.0, 3.0, 4.0], "{device}");
        let pa = two_row_blocks(&p0, p1);
        // A 0-d value, broadcast: a[2] = 0.5
        let half = Tensor::from_slice(&[0.5f32], &[]).unwrap();
        pa.scatter(&half, 2i64, 0, false).unwrap();
        assert_eq!(got(&other), vec![0.5, 0.5, 3.0, 4.0], "{device}");
        // Rows 0 and 3 gathered into a partition on kDLCPU, the device of row 0: row 3 is
        // read where it is, with no transfer, and picked into plain host memory, not new
        // pinned memory (which would need CUDA).
        // numpy: a = [[1, 2], [-7, -7], [0.5, 0.5], [3, 4]]; a[[0, 3]]
        let rows = Tensor::from_slice(&[0i64, 3], &[2]).unwrap();
        let picked = pa.gather(&rows, 0, false).unwrap();
        assert_eq!(picked.devices(), vec![Device::CPU], "{device}");
        assert_eq!(
            got(&picked.assemble(None, false).unwrap()),
            vec![1.0, 2.0, 3.0, 4.0],
            "{device}"
        );
    }
}

#[test]
fn one_index_drops_the_axis_as_numpy_does() {
    let (t, a) = global(&[7, 5]);
    let pa = PartitionedArray::partition(&t, &Layout::tiling(&[3, 2])).unwrap();
    let one = |i: i64| Tensor::from_slice(&[i], &[]).unwrap();
    // numpy.take(a, -2, 1) is a[:, 3], and keeps the split points of axis 0.
    let got = pa.gather(one(-2), 1, false).unwrap();
    assert_eq!((got.shape(), got.grid().tiling()), (&[7][..], vec![3]));
    let whole = got.assemble(None, false).unwrap();
    assert_eq!(
        whole.to_array::<i32>().unwrap(),
        a.slice(s![.., 3]).into_dyn()
    );
    // Down to a 0-d array: one element of a 1-d one.
    let (v, _) = global(&[5]);
    let line = PartitionedArray::partition(&v, &Layout::tiling(&[2])).unwrap();
    let got = line.gather(one(3), 0, false).unwrap();
    assert_eq!((got.shape(), got.len()), (&[][..], 1));
    let whole = got.assemble(None, false).unwrap();
    assert_eq!(
        whole.to_array::<i32>().unwrap().into_raw_vec_and_offset().0,
        [3]
    );
    // Scatter: a[4] = values, values without the axis.
    let values = Tensor::from_slice(&[-1i32, -2, -3, -4, -5], &[5]).unwrap();
    pa.scatter(&values, one(4), 0, false).unwrap();
    let mut want = a.clone();
    want.slice_mut(s![4, ..])
        .assign(&ndarray::arr1(&[-1, -2, -3, -4, -5]));
    assert_eq!(t.to_array::<i32>().unwrap(), want);
    // Values of shape (5, 1) do not broadcast to a row of 5 (numpy refuses them too; those
    // of shape (1, 5) it takes, dropping the leading axis).
    let e = pa
        .scatter(&values.with_unit_axis(1), one(4), 0, false)
        .unwrap_err();
    assert!(e.to_string().contains("must have shape (5,)"), "{e}");
    assert_eq!(
        pa.serving(one(-1), 0).unwrap(),
        vec![vec![2, 0], vec![2, 1]]
    );
}

/// A partitioned scatter broadcasts its values as numpy's fancy assignment does: a 0-d value
/// at every element written, one value per index along the axis.
#[test]
fn scatter_broadcasts_values_as_numpy_does() {
    let idx = Tensor::from_slice(&[6i64, 0, 3], &[3]).unwrap();
    let cases = [
        (Tensor::from_slice(&[-1i32], &[]).unwrap(), [-1; 3]),
        (
            Tensor::from_slice(&[-1i32, -2, -3], &[3, 1]).unwrap(),
            [-1, -2, -3],
        ),
    ];
    for (values, per_index) in cases {
        let (t, a) = global(&[7, 5]);
        let pa = PartitionedArray::partition(&t, &Layout::tiling(&[3, 2])).unwrap();
        pa.scatter(&values, &idx, 0, false).unwrap();
        // numpy: a[[6, 0, 3]] = values
        let mut want = a.clone();
        for (&row, &x) in [6usize, 0, 3].iter().zip(&per_index) {
            want.slice_mut(s![row, ..]).fill(x);
        }
        assert_eq!(t.to_array::<i32>().unwrap(), want, "{values:?}");
        // Values that do not broadcast: refused, nothing written.
        let long = Tensor::from_slice(&[0i32; 10], &[2, 5]).unwrap();
        let e = pa.scatter(&long, &idx, 0, false).unwrap_err().to_string();
        assert!(
            e.contains("must have shape (3, 5) (or values that broadcast"),
            "{e}"
        );
        assert_eq!(t.to_array::<i32>().unwrap(), want);
    }
}

#[test]
fn scatter_refuses_partitions_that_share_memory_and_writes_nothing() {
    // Rows 0..2 and 2..4 of a 4x2 array, both over one 2x2 buffer: the scatter of rows 2 and
    // 0 would leave what the partition written last was given, not numpy's last duplicate.
    let shared = Tensor::from_slice(&[0.0f32; 4], &[2, 2]).unwrap();
    let e = scatter_rows(&shared, shared.clone(), &[2, 0], false).unwrap_err();
    assert!(matches!(e, Error::Buffer { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "target partitions (0, 0) and (1, 0) share memory: their copies would race"
    );
    assert_eq!(
        shared.to_array::<f32>().unwrap().sum(),
        0.0,
        "nothing written"
    );
    // Partly overlapping: the second partition's first row is the first one's last.
    let base = Tensor::from_slice(&[0.0f32; 6], &[3, 2]).unwrap();
    let (top, bottom) = (
        base.view(&[0, 0], &[2, 2]).unwrap(),
        base.view(&[1, 0], &[2, 2]),
    );
    assert!(scatter_rows(&top, bottom.unwrap(), &[0, 3], false).is_err());
    // Only the partitions written count: one of the two alone is written as asked.
    scatter_rows(&shared, shared.clone(), &[1, 0], false).unwrap();
    assert_eq!(
        shared
            .to_array::<f32>()
            .unwrap()
            .into_raw_vec_and_offset()
            .0,
        [3.0, 4.0, 1.0, 2.0]
    );
}

/// A scatter refused by a partition another thread is reading writes no partition, not
/// even those before it: every partition written is claimed before the first write.
#[test]
fn scatter_refused_by_a_partition_in_use_writes_nothing() {
    let t = Tensor::from(ndarray::Array2::<i32>::zeros((4, 3)));
    let pa = PartitionedArray::partition(&t, &Layout::tiling(&[2, 1])).unwrap();
    let second = pa.at(&[1, 0]).unwrap().tensor().unwrap().clone();
    let values = Tensor::from(ndarray::array![[1, 1, 1], [2, 2, 2]]);
    let reader = second.as_array::<i32>().unwrap(); // as another thread reading it
    let e = pa.scatter(&values, [0, 3], 0, false).unwrap_err();
    drop(reader);
    assert!(matches!(e, Error::Buffer { .. }), "{e}");
    // Named: the partition written, by its flat index, and what holds it.
    let e = e.to_string();
    assert!(
        e.starts_with(
            "scatter: cannot write its partition 1, Tensor(shape=(2, 3), dtype=int32, \
             device=kDLCPU): host memory 0x"
        ) && e.contains("being read at the same time by as_array (its live view)"),
        "{e}"
    );
    let zeros = ndarray::Array2::<i32>::zeros((4, 3)).into_dyn();
    assert_eq!(t.to_array::<i32>().unwrap(), zeros, "nothing written");
    // Once the reader is gone the same scatter writes both rows.
    pa.scatter(&values, [0, 3], 0, false).unwrap();
    let mut want = ndarray::Array2::<i32>::zeros((4, 3));
    want.row_mut(0).fill(1);
    want.row_mut(3).fill(2);
    assert_eq!(t.to_array::<i32>().unwrap(), want.into_dyn());
}

/// A 4x2 array of two row blocks, `p0` over rows 0..2 and `p1` over rows 2..4.
fn two_row_blocks(p0: &Tensor, p1: Tensor) -> PartitionedArray {
    PartitionedArray::new(
        Grid::even(&[4, 2], &[2, 1]).unwrap(),
        vec![Data::Tensor(p0.clone()), Data::Tensor(p1)],
        vec![vec![], vec![]],
        None,
    )
    .unwrap()
}

/// Scatters float32 values `1..=4` (two rows) into rows `rows` of a 4x2 array of two row
/// blocks, `p0` over rows 0..2 and `p1` over rows 2..4.
fn scatter_rows(p0: &Tensor, p1: Tensor, rows: &[i64; 2], transfer: bool) -> Result<()> {
    let pa = two_row_blocks(p0, p1);
    let values = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    pa.scatter(
        &values,
        Tensor::from_slice(rows, &[2]).unwrap(),
        0,
        transfer,
    )
}

#[test]
fn gather_and_scatter_take_global_indices() {
    let (t, a) = global(&[7, 5]);
    let pa = PartitionedArray::partition(&t, &Layout::tiling(&[3, 2])).unwrap();
    let idx = [6i64, -7, 3, 3, 4, 0];
    let it = Tensor::from_slice(&idx, &[idx.len()]).unwrap();
    let rows: Vec<usize> = idx.iter().map(|&i| i.rem_euclid(7) as usize).collect();
    let got = pa.gather(&it, 0, false).unwrap();
    assert_eq!(got.shape(), &[6, 5]);
    assert_eq!(got.grid().splits()[1], vec![0, 3, 5]);
    let want = a.select(ndarray::Axis(0), &rows);
    assert_eq!(
        got.assemble(None, false)
            .unwrap()
            .to_array::<i32>()
            .unwrap(),
        want
    );
    let cols = Tensor::from_slice(&[4u8, 1], &[2]).unwrap();
    let got = pa.gather(&cols, 1, false).unwrap();
    let want = a.select(ndarray::Axis(1), &[4, 1]);
    assert_eq!(
        got.assemble(None, false)
            .unwrap()
            .to_array::<i32>()
            .unwrap(),
        want
    );
    let e = pa
        .gather(Tensor::from_slice(&[7i64], &[1]).unwrap(), 0, false)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "index 7 is out of bounds for axis 0 with size 7"
    );

    // scatter: the last duplicate wins, as in numpy
    let values: Vec<i32> = (0..30).map(|v| -v).collect();
    let vt = Tensor::from_slice(&values, &[6, 5]).unwrap();
    let (target, mut expect) = global(&[7, 5]);
    let tpa = PartitionedArray::partition(&target, &Layout::tiling(&[3, 2])).unwrap();
    tpa.scatter(&vt, &it, 0, false).unwrap();
    let v = ArrayD::from_shape_vec(IxDyn(&[6, 5]), values).unwrap();
    for (k, &r) in rows.iter().enumerate() {
        expect.slice_mut(s![r, ..]).assign(&v.slice(s![k, ..]));
    }
    assert_eq!(target.to_array::<i32>().unwrap(), expect);
    let bad = Tensor::from_slice(&[0i64, 9], &[2]).unwrap();
    let before = target.to_array::<i32>().unwrap();
    let two = Tensor::from_slice(&[0i32; 10], &[2, 5]).unwrap();
    assert!(tpa.scatter(&two, &bad, 0, false).is_err());
    assert_eq!(target.to_array::<i32>().unwrap(), before, "nothing written");
}

/// A read-only float32 tensor of `n` elements all at one address (stride 0), like a
/// broadcast numpy array handed over through DLPack.
fn broadcast(value: &'static f32, n: usize) -> Tensor {
    let data = std::ptr::from_ref(value).cast_mut().cast::<u8>();
    // SAFETY: with stride 0 every index addresses `value`, which is 'static; read-only, so
    // nothing writes it.
    unsafe {
        Tensor::from_raw_parts(
            data,
            vec![n],
            vec![0],
            DType::Float32,
            Device::CPU,
            true,
            std::sync::Arc::new(()),
        )
    }
}

#[test]
fn gather_memory_grows_with_the_indices_not_the_axis() {
    static FOUR: f32 = 4.0;
    let t = broadcast(&FOUR, 1 << 40);
    let pa = PartitionedArray::partition(&t, &Layout::tiling(&[2])).unwrap();
    let idx = Tensor::from_slice(&[5i64, -1, 1 << 39], &[3]).unwrap();
    let got = pa
        .gather(&idx, 0, false)
        .unwrap()
        .assemble(None, false)
        .unwrap();
    assert_eq!(
        got.to_array::<f32>().unwrap().as_slice(),
        Some(&[4.0; 3][..])
    );
}

/// A 2x2 view of `base`'s memory with `strides` (in elements) on `device`.
///
/// # Safety
/// Every element the strides reach lies in `base`'s memory.
pub(crate) unsafe fn view_2x2(base: &Tensor, strides: [isize; 2], device: Device) -> Tensor {
    // SAFETY: the caller's promise that the view stays in `base`'s memory, which `base`'s
    // owner, cloned into the view, keeps alive.
    unsafe {
        Tensor::from_raw_parts(
            base.data_ptr(),
            vec![2, 2],
            strides.to_vec(),
            base.dtype(),
            device,
            false,
            base.owner().clone(),
        )
    }
}

/// [`scatter_rows`] into rows 0 and 3.
fn scatter_rows_0_and_3(p0: &Tensor, p1: Tensor, transfer: bool) -> Result<()> {
    scatter_rows(p0, p1, &[0, 3], transfer)
}

#[test]
fn scatter_refuses_a_partition_that_repeats_an_element_before_writing() {
    let p0 = Tensor::from_slice(&[-7.0f32; 4], &[2, 2]).unwrap();
    let other = Tensor::from_slice(&[-7.0f32; 2], &[2]).unwrap();
    // SAFETY: a zero stride over rows reaches `other`'s two elements only.
    let p1 = unsafe { view_2x2(&other, [0, 1], Device::CPU) };
    let e = scatter_rows_0_and_3(&p0, p1, false).unwrap_err();
    assert!(matches!(e, Error::Buffer { .. }), "{e}");
    assert!(e.to_string().contains("partition (1, 0)"), "{e}");
    assert_eq!(
        p0.to_array::<f32>().unwrap().as_slice(),
        Some(&[-7.0; 4][..])
    );
    assert_eq!(
        other.to_array::<f32>().unwrap().as_slice(),
        Some(&[-7.0; 2][..])
    );
    // The same out refused by the tensor gather and scatter.
    let (src, _) = global(&[4, 2]);
    let out = Tensor::zeros(&[2, 2], DType::Int32).unwrap();
    // SAFETY: as above, over `out`'s first row.
    let repeated = unsafe { view_2x2(&out, [0, 1], Device::CPU) };
    let rows = Tensor::from_slice(&[1i64, 0], &[2]).unwrap();
    let e = crate::ops::gather(&src, &rows, 0, Some(&repeated)).unwrap_err();
    assert!(
        e.to_string()
            .contains("refers to some element more than once"),
        "{e}"
    );
    let vals = Tensor::from_slice(&[1i32, 2, 3, 4], &[2, 2]).unwrap();
    let e = crate::ops::scatter(&vals, &rows, &repeated, 0).unwrap_err();
    assert!(
        e.to_string()
            .contains("refers to some element more than once"),
        "{e}"
    );
    assert_eq!(out.to_array::<i32>().unwrap().as_slice(), Some(&[0; 4][..]));
}

#[test]
fn scatter_checks_every_target_device_before_writing() {
    let p0 = Tensor::from_slice(&[-7.0f32; 4], &[2, 2]).unwrap();
    let other = Tensor::from_slice(&[-7.0f32; 4], &[2, 2]).unwrap();
    for device in [
        Device::new(DeviceType::OpenCl, 0).unwrap(),
        Device::new(DeviceType::Metal, 0).unwrap(),
    ] {
        // SAFETY: `other`'s four elements, in C order; the tensor is only ever checked here
        // (no backend reads or writes `device`).
        let p1 = unsafe { view_2x2(&other, [2, 1], device) };
        let e = scatter_rows_0_and_3(&p0, p1, true).unwrap_err().to_string();
        assert!(e.contains(&device.to_string()), "{device}: {e}");
        assert_eq!(
            p0.to_array::<f32>().unwrap().as_slice(),
            Some(&[-7.0; 4][..]),
            "{device}"
        );
    }
}

#[test]
fn scatter_reads_values_that_view_the_array_before_writing_it() {
    // x = rows 0..4 of 2 in two row blocks, viewing one buffer; x[[1, 2]] = x[0:2] must write
    // the old rows 0 and 1, as numpy's fancy assignment does, though writing row 1 (first
    // block) changes the values that row 2 (second block) is read from.
    let base = ndarray::Array2::from_shape_fn((4, 2), |(i, j)| (10 * i + j) as f32);
    let whole = Tensor::from(base.clone());
    let pa = PartitionedArray::partition(&whole, &Layout::tiling(&[2, 1])).unwrap();
    let values = whole.view(&[0, 0], &[2, 2]).unwrap();
    let idx = Tensor::from_slice(&[1i64, 2], &[2]).unwrap();
    pa.scatter(&values, &idx, 0, false).unwrap();
    let mut expected = base.clone();
    expected.row_mut(1).assign(&base.row(0));
    expected.row_mut(2).assign(&base.row(1));
    assert_eq!(whole.as_array::<f32>().unwrap(), expected.into_dyn());
}

/// Rows [0, 4) held as handles not fetched yet, rows [4, 7) as data: a gather or scatter of
/// rows 4 to 6 needs only the data ([`PartitionedArray::serving`] says which), one touching
/// row 0 names the handle it lacks.
#[test]
fn gather_and_scatter_need_data_only_where_an_index_falls() {
    let (t, a) = global(&[7, 2]);
    let grid = Grid::from_splits(&[7, 2], vec![vec![0, 4, 7], vec![0, 1, 2]]).unwrap();
    let data: Vec<Data> = (0..4)
        .map(|f| match f < 2 {
            true => Data::Handle(Handle::new(f)),
            false => Data::Tensor(t.view(&[4, f - 2], &[3, 1]).unwrap()),
        })
        .collect();
    let locs = vec![vec![Location::rank(0, Device::CPU)]; 4];
    let pa = PartitionedArray::new(grid, data, locs, None)
        .unwrap()
        .with_dtype(DType::Int32)
        .unwrap();
    let rows = Tensor::from_slice(&[6i64, -3], &[2]).unwrap();
    assert_eq!(pa.serving(&rows, 0).unwrap(), vec![vec![1, 0], vec![1, 1]]);
    let cols = Tensor::from_slice(&[1i64], &[1]).unwrap();
    assert_eq!(pa.serving(&cols, 1).unwrap(), vec![vec![0, 1], vec![1, 1]]);
    let got = pa.gather(&rows, 0, false).unwrap();
    let want = a.select(ndarray::Axis(0), &[6, 4]);
    let got = got
        .assemble(None, false)
        .unwrap()
        .to_array::<i32>()
        .unwrap();
    assert_eq!(got, want);
    let none = Tensor::from_slice::<i64>(&[], &[0]).unwrap();
    assert_eq!(pa.gather(&none, 0, false).unwrap().shape(), &[0, 2]);
    let values = Tensor::from_slice(&[-1i32, -2], &[1, 2]).unwrap();
    pa.scatter(
        &values,
        Tensor::from_slice(&[5i64], &[1]).unwrap(),
        0,
        false,
    )
    .unwrap();
    assert_eq!(
        t.to_array::<i32>().unwrap().slice(s![5, ..]).to_vec(),
        vec![-1, -2]
    );
    let e = pa.gather(&cols, 1, false).unwrap_err().to_string();
    assert!(
        e.contains("(0, 1)") && e.contains("handle not fetched"),
        "{e}"
    );
    let e = pa.scatter(
        &values,
        Tensor::from_slice(&[0i64], &[1]).unwrap(),
        0,
        false,
    );
    assert!(e.unwrap_err().to_string().contains("(0, 0)"));
    assert!(pa
        .serving(Tensor::from_slice(&[7i64], &[1]).unwrap(), 0)
        .is_err());
}

/// A gather with no indices reads no partition: over unfetched handles the dtype is unknown,
/// an error naming how to give it rather than a made-up float32; once stated, or once a
/// partition is fetched, the empty result has that dtype.
#[test]
fn a_gather_of_no_indices_needs_the_dtype() {
    let handles = || {
        let data = vec![
            Data::Handle(Handle::new(0u8)),
            Data::Handle(Handle::new(1u8)),
        ];
        let grid = Grid::even(&[4, 2], &[2, 1]).unwrap();
        PartitionedArray::new(grid, data, vec![vec![], vec![]], None).unwrap()
    };
    let none = Tensor::from_slice::<i64>(&[], &[0]).unwrap();
    let e = handles().gather(&none, 0, false).unwrap_err();
    assert_eq!(e.kind(), "ValueError");
    let msg = e.to_string();
    assert!(
        msg.contains("gather needs the array's dtype") && msg.contains("with_dtype"),
        "{msg}"
    );
    assert!(
        msg.contains("none of the 2 partitions holds data here"),
        "{msg}"
    );
    let stated = handles().with_dtype(DType::Int32).unwrap();
    let got = stated.gather(&none, 0, false).unwrap();
    assert_eq!(
        (got.dtype(), got.shape()),
        (Some(DType::Int32), &[0, 2][..])
    );
    let mut fetched = handles();
    let rows = Tensor::from(ndarray::Array2::<i64>::zeros((2, 2)));
    fetched.set_fetched(&[1], vec![rows]).unwrap();
    let got = fetched.gather(&none, 1, false).unwrap();
    assert_eq!(
        (got.dtype(), got.shape()),
        (Some(DType::Int64), &[4, 0][..])
    );
    let whole = got.assemble(None, false).unwrap();
    assert_eq!(
        whole.to_array::<i64>().unwrap(),
        ArrayD::<i64>::zeros(IxDyn(&[4, 0]))
    );
}

/// A device of negative id (built through `Device`'s public fields, as `Device::new` refuses
/// it) is refused wherever a caller names a device to put data on, by an error naming it,
/// before anything is made there.
#[test]
fn a_device_of_negative_id_is_refused_as_a_target() {
    for bad in [
        Device {
            kind: DeviceType::Cpu,
            id: -5,
        },
        Device {
            kind: DeviceType::Cuda,
            id: -1,
        },
        Device {
            kind: DeviceType::CudaHost,
            id: -2,
        },
    ] {
        let refused = |e: Error| {
            assert_eq!(e.kind(), "DeviceError", "{e}");
            assert_eq!(
                e.to_string(),
                format!("invalid device \"{bad}\": the device id must be >= 0")
            );
        };
        let (t, _) = global(&[4, 4]);
        let pa = PartitionedArray::partition(&t, &Layout::tiling(&[2, 1])).unwrap();
        refused(
            pa.repartition(&Layout::tiling(&[1, 2]).on(bad), true)
                .unwrap_err(),
        );
        let each = Layout::tiling(&[1, 2]).devices(vec![Device::CPU, bad]);
        refused(pa.repartition(&each, true).unwrap_err());
        let dealt = Layout::block_cyclic(&[1, 1], vec![Device::CPU, bad]);
        refused(pa.repartition(&dealt, true).unwrap_err());
        refused(pa.assemble(Some(bad), true).unwrap_err());
        refused(pa.to(bad).unwrap_err());
        refused(crate::ops::to_device(&t, bad).unwrap_err());
        refused(crate::backend::check_present(bad).unwrap_err());
        refused(crate::backend::backend_for(bad).map(drop).unwrap_err());
    }
}

/// `set_fetched` for a partition out of range says so, with the range; for one that holds no
/// handle, says what it holds; either way nothing changes.
#[test]
fn set_fetched_names_a_partition_out_of_range_or_without_a_handle() {
    let grid = Grid::even(&[4, 2], &[2, 1]).unwrap();
    let data = vec![Data::Handle(Handle::new(0u8)), Data::Remote];
    let mut pa = PartitionedArray::new(grid, data, vec![vec![], vec![]], None).unwrap();
    let rows = || vec![Tensor::from(ndarray::Array2::<i32>::zeros((2, 2)))];
    let e = pa.set_fetched(&[9], rows()).unwrap_err().to_string();
    assert_eq!(
        e,
        "fetched data for a partition of the 2 (flat indices 0 to 1): partition 9, out of range"
    );
    let e = pa.set_fetched(&[1], rows()).unwrap_err().to_string();
    assert_eq!(
        e,
        "fetched data for a partition holding a handle: partition 1 at (1, 0), which holds \
         no handle to fetch (another rank's partition)"
    );
    assert!(pa.data()[0].handle().is_some() && pa.dtype().is_none());
    pa.set_fetched(&[0], rows()).unwrap();
    let e = pa.set_fetched(&[0], rows()).unwrap_err().to_string();
    assert_eq!(
        e,
        "fetched data for a partition holding a handle: partition 0 at (0, 0), which holds \
         data already"
    );
}

/// `set_fetched` of one partition twice names it and changes nothing: neither tensor is kept.
#[test]
fn set_fetched_names_a_partition_listed_twice() {
    let grid = Grid::even(&[4, 2], &[2, 1]).unwrap();
    let handles = vec![
        Data::Handle(Handle::new(0u8)),
        Data::Handle(Handle::new(1u8)),
    ];
    let mut pa = PartitionedArray::new(grid, handles, vec![vec![], vec![]], None).unwrap();
    let rows = |v| Tensor::from(ndarray::Array2::<i32>::from_elem((2, 2), v));
    let e = pa
        .set_fetched(&[1, 0, 1], vec![rows(1), rows(0), rows(2)])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "fetched data for each partition once: partition 1 at (1, 0) is listed twice"
    );
    assert!(pa.data().iter().all(|d| d.handle().is_some()) && pa.dtype().is_none());
    // Out of range, the index is named all the same.
    let e = pa.set_fetched(&[7, 7], vec![rows(0), rows(0)]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "fetched data for each partition once: partition 7 is listed twice"
    );
    pa.set_fetched(&[1, 0], vec![rows(1), rows(0)]).unwrap();
    assert_eq!(
        pa.tensors().unwrap()[1].to_array::<i32>().unwrap()[[0, 0]],
        1
    );
}

#[test]
fn a_location_may_name_the_device_the_producer_reports_but_no_other() {
    // Data imported on kDLCPU (as its capsule says) whose producer's `__dlpack_device__`
    // names kDLCPU:2: a location in this process naming either is not a contradiction.
    let (t, _) = global(&[4]);
    let grid = Grid::even(&[4], &[2]).unwrap();
    let data = PartitionedArray::from_tensor(&t, grid.clone())
        .unwrap()
        .data()
        .to_vec();
    let cpu = |id| Device::new(DeviceType::Cpu, id).unwrap();
    let here = |d| vec![Location::new("1.1.1.1", me(), d)];
    let locs = LocationTable::from(vec![here(cpu(2)), here(Device::CPU)]);
    let reported = [(0, cpu(2)), (1, cpu(2))];
    let new = |reported: &[(usize, Device)], locs: &LocationTable| {
        PartitionedArray::new_in_order(
            grid.clone(),
            data.clone(),
            locs.clone(),
            None,
            None,
            Vec::new(),
            reported,
        )
    };
    let pa = new(&reported, &locs).unwrap();
    assert_eq!(pa.locations(0), &here(cpu(2))[..], "kept as given");
    let e = new(&[], &locs).unwrap_err();
    assert_eq!(invariants(&e), vec![("location".into(), Some(vec![0]), 9)]);
    // A location naming a third device still contradicts the data, and says what both name.
    let third = LocationTable::from(vec![here(cpu(3)), here(Device::CPU)]);
    let e = new(&reported, &third).unwrap_err();
    assert_eq!(invariants(&e), vec![("location".into(), Some(vec![0]), 9)]);
    let msg = e.to_string();
    assert!(
        msg.contains(
            "data lives on kDLCPU (its producer's __dlpack_device__ names kDLCPU:2) but the \
             locations in this process name kDLCPU:3"
        ),
        "{msg}"
    );
    // Fetched data too.
    let fetched = |reported: &[(usize, Device)]| {
        let handles = vec![
            Data::Handle(Handle::new(0u8)),
            Data::Handle(Handle::new(1u8)),
        ];
        let mut pa = PartitionedArray::new(
            grid.clone(),
            handles,
            vec![here(cpu(2)), here(Device::CPU)],
            None,
        )
        .unwrap();
        let tensors = data.iter().map(|d| d.tensor().unwrap().clone()).collect();
        pa.set_fetched_where(&[0, 1], tensors, false, reported)
    };
    fetched(&reported).unwrap();
    let e = fetched(&[(1, cpu(2))]).unwrap_err().to_string();
    assert!(
        e.contains("fetched data lives on kDLCPU but the locations in this process name kDLCPU:2"),
        "{e}"
    );
}
