//! The emulated driver's own checks: copies and kernels outside device memory, queued work
//! running when the host waits, stream waits in the right direction.

use super::*;
use crate::backend::{Backend, BoxCopy};
use crate::dtype::DType;
use crate::tensor::Tensor;

/// Emulated device `n` (3 and up): one per test, so that no other test's queued work
/// (or its error) shares the stream.
fn backend(n: u32) -> Arc<CudaBackend> {
    CudaBackend::emulated(n)
}

#[test]
fn copies_outside_device_memory_are_refused() {
    let be = backend(3);
    let t = be.empty(&[4], DType::Float32).unwrap();
    let at = t.data_ptr() as u64;
    // SAFETY: the emulation checks the range before touching anything.
    let past_end = unsafe { be.driver.copy_htod(at + 8, &[0u8; 16]) };
    assert!(
        past_end
            .unwrap_err()
            .to_string()
            .contains("not inside one device allocation"),
        "a copy past the end"
    );
    let host = [0u8; 16];
    // SAFETY: as above.
    let e = unsafe { be.driver.memset_zero(host.as_ptr() as u64, 16) }.unwrap_err();
    assert!(e.to_string().contains("CUDA_ERROR_INVALID_VALUE"), "{e}");
}

#[test]
fn kernels_touching_host_memory_fail_at_the_next_synchronisation() {
    let be = backend(4);
    let host = Tensor::from_slice(&[1f32, 2., 3., 4.], &[4]).unwrap();
    // Host memory passed off as device memory: the kernel must not read it.
    // SAFETY: only the emulated kernel reads through it, and the emulation refuses.
    let fake = unsafe {
        Tensor::from_raw_parts(
            host.data_ptr(),
            vec![4],
            vec![1],
            DType::Float32,
            be.device(),
            false,
            host.owner().clone(),
        )
    };
    let dst = be.empty(&[4], DType::Float32).unwrap();
    be.copy_boxes(&[BoxCopy {
        src: &fake,
        src_start: vec![0],
        dst: &dst,
        dst_start: vec![0],
        shape: vec![4],
    }])
    .unwrap();
    let e = be.synchronize().unwrap_err().to_string();
    assert!(e.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
    // The error is reported once; the stream goes on.
    be.synchronize().unwrap();
}

#[test]
fn queued_work_runs_when_the_host_waits() {
    let be = backend(5);
    let t = be.empty(&[16], DType::UInt8).unwrap();
    let at = t.data_ptr() as u64;
    let mut pinned = crate::backend::cuda::context::PinnedBuffer::alloc(&be.driver, 16).unwrap();
    // SAFETY: `t` holds 16 bytes; the pinned buffer is read only after synchronising.
    unsafe {
        be.driver.copy_htod(at, &[7u8; 16]).unwrap();
        be.driver.copy_dtoh(pinned.as_mut_slice(), at).unwrap();
    }
    assert_eq!(pinned.as_mut_slice()[0], POISON, "nothing has run yet");
    be.synchronize().unwrap();
    assert_eq!(pinned.as_mut_slice(), &[7u8; 16]);
    // An event recorded after queued work fires only once that work has run.
    let ev = be.driver.event_create().unwrap();
    // SAFETY: live event, our stream, 16 bytes of `t`.
    unsafe {
        be.driver.memset_zero(at, 16).unwrap();
        be.driver.event_record(ev, be.driver.stream()).unwrap();
        be.driver.copy_dtoh(pinned.as_mut_slice(), at).unwrap();
        be.driver.event_synchronize(ev).unwrap();
    }
    assert_eq!(
        pinned.as_mut_slice(),
        &[7u8; 16],
        "the copy after the event is still queued"
    );
    be.synchronize().unwrap();
    assert_eq!(pinned.as_mut_slice(), &[0u8; 16]);
    // SAFETY: created above, destroyed once.
    unsafe { be.driver.event_destroy(ev) }.unwrap();
    // SAFETY: as above.
    assert!(unsafe { be.driver.event_destroy(ev) }.is_err());
}

/// Reads `n` bytes of emulated device memory directly, without waiting for anything.
fn peek(t: &Tensor, n: usize) -> Vec<u8> {
    // SAFETY: emulated device memory is host memory of at least `n` bytes here.
    unsafe { std::slice::from_raw_parts(t.data_ptr(), n) }.to_vec()
}

#[test]
fn a_consumer_stream_waits_for_the_work_queued_before_the_export() {
    let be = backend(6);
    let t = be.empty(&[16], DType::UInt8).unwrap();
    // SAFETY: 16 bytes of `t`, on our stream.
    unsafe { be.driver.memset_zero(t.data_ptr() as u64, 16) }.unwrap();
    // DLPack export to a consumer on the legacy default stream (1).
    be.make_consumer_wait(Some(1)).unwrap();
    assert_eq!(peek(&t, 16), vec![POISON; 16], "nothing has run yet");
    // The consumer's stream reaches a point after the wait: our zeroing has run.
    let ev = streams::event_create();
    streams::event_record(ev, 1).unwrap();
    streams::event_synchronize(ev).unwrap();
    assert_eq!(peek(&t, 16), vec![0; 16]);
    streams::event_destroy(ev).unwrap();

    // Import: our stream waits for the producer's work on the per-thread stream (2).
    let ev = streams::event_create();
    let (at, mark) = (t.data_ptr() as u64, 0x5au8);
    let produce = move || {
        // SAFETY: 16 bytes of `t`, alive until the end of the test (it synchronises).
        unsafe { (at as *mut u8).write_bytes(mark, 16) };
        Ok(())
    };
    streams::enqueue(2, Box::new(produce), "producer").unwrap();
    be.wait_for_producer(Some(2)).unwrap();
    streams::event_record(ev, be.driver.stream()).unwrap();
    streams::event_synchronize(ev).unwrap();
    assert_eq!(peek(&t, 16), vec![mark; 16]);
    streams::event_destroy(ev).unwrap();
    be.synchronize().unwrap();
}

#[test]
fn the_host_waits_for_a_producer_writing_memory_it_reads_directly() {
    // Pinned or managed memory a producer's kernel on the legacy stream is still writing:
    // an import must not read it before that kernel has run.
    let be = backend(10);
    let host = Arc::new(Mutex::new(vec![0u8; 16]));
    let written = host.clone();
    let produce = move || {
        written.lock().unwrap().fill(0x5a);
        Ok(())
    };
    streams::enqueue(1, Box::new(produce), "producer").unwrap();
    // -1: the consumer asked for no wait, and none happens.
    be.host_wait_for(Some(-1)).unwrap();
    assert_eq!(*host.lock().unwrap(), vec![0; 16], "nothing has run yet");
    be.host_wait_for(Some(1)).unwrap();
    assert_eq!(*host.lock().unwrap(), vec![0x5a; 16]);
    assert!(be.host_wait_for(Some(0)).is_err(), "stream 0 is invalid");
}

/// The 16 float32 `0.0..16.0` on emulated device `be`, and a reversed view of the same memory.
fn ramp_and_reversed(be: &CudaBackend) -> (Tensor, Tensor) {
    let values: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let host = Tensor::from_slice(&values, &[16]).unwrap();
    let t = be.empty(&[16], DType::Float32).unwrap();
    be.copy_host_to_device(&host, &t).unwrap();
    // SAFETY: element `i` of the view is element `15 - i` of `t`, inside its allocation, kept
    // alive by its owner.
    let reversed = unsafe {
        Tensor::from_raw_parts(
            t.data_ptr().wrapping_add(15 * 4),
            vec![16],
            vec![-1],
            DType::Float32,
            be.device(),
            false,
            t.owner().clone(),
        )
    };
    (t, reversed)
}

fn on_host(be: &CudaBackend, t: &Tensor) -> Vec<f32> {
    let out = Tensor::from_slice(&[0f32; 16], &[16]).unwrap();
    be.copy_device_to_host(t, &out).unwrap();
    // SAFETY: `out` holds 16 contiguous float32 on the host.
    unsafe { std::slice::from_raw_parts(out.data_ptr() as *const f32, 16) }.to_vec()
}

#[test]
fn a_source_overlapping_its_own_destination_is_read_before_it_is_written() {
    let be = backend(7);
    // Shifted by one element within one tensor: t[1..16] = t[0..15].
    let (t, _) = ramp_and_reversed(&be);
    be.copy_boxes(&[BoxCopy {
        src: &t,
        src_start: vec![0],
        dst: &t,
        dst_start: vec![1],
        shape: vec![15],
    }])
    .unwrap();
    let want: Vec<f32> = [0.0].into_iter().chain((0..15).map(|i| i as f32)).collect();
    assert_eq!(on_host(&be, &t), want);
    // Reversed in place, through the trait and through a same-device transfer.
    let (t, reversed) = ramp_and_reversed(&be);
    be.copy_boxes(&[BoxCopy::whole(&t, &reversed)]).unwrap();
    let want: Vec<f32> = (0..16).rev().map(|i| i as f32).collect();
    assert_eq!(on_host(&be, &t), want);
    let (t, reversed) = ramp_and_reversed(&be);
    be.copy_device_to_device(&reversed, &t).unwrap();
    assert_eq!(on_host(&be, &t), want);
}

#[test]
fn an_error_after_queued_work_returns_once_that_work_has_run() {
    let be = backend(8);
    let values: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let src = be.empty(&[16], DType::Float32).unwrap();
    be.copy_host_to_device(&Tensor::from_slice(&values, &[16]).unwrap(), &src)
        .unwrap();
    let idx = be.empty(&[4], DType::Int64).unwrap();
    let host_idx = Tensor::from_slice(&[3i64, 2, 1, 0], &[4]).unwrap();
    be.copy_host_to_device(&host_idx, &idx).unwrap();
    let out = be.empty(&[4], DType::Float32).unwrap();
    // Reading the index verdict back fails, after the gather kernel was queued.
    be.fail_emulated(EmulatedCall::CopyDtoh, 0);
    let e = be.gather(&src, &idx, 0, &out).unwrap_err();
    assert!(e.to_string().contains("made to fail"), "{e}");
    assert!(be.emulated_faults_spent());
    // The caller may free `out` now: the gather has run, nothing is left queued on it.
    let want: Vec<u8> = [3f32, 2., 1., 0.]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    assert_eq!(peek(&out, 16), want);
}

#[test]
fn a_gather_or_scatter_source_overlapping_its_output_is_read_before_it_is_written() {
    let be = backend(9);
    let every: Vec<i64> = (0..16).collect();
    let idx = be.empty(&[16], DType::Int64).unwrap();
    be.copy_host_to_device(&Tensor::from_slice(&every, &[16]).unwrap(), &idx)
        .unwrap();
    let want: Vec<f32> = (0..16).rev().map(|i| i as f32).collect();
    // t = reversed(t), through take and through put along the one axis.
    let (t, reversed) = ramp_and_reversed(&be);
    be.gather(&reversed, &idx, 0, &t).unwrap();
    assert_eq!(on_host(&be, &t), want);
    let (t, reversed) = ramp_and_reversed(&be);
    be.scatter(&reversed, &idx, 0, &t).unwrap();
    assert_eq!(on_host(&be, &t), want);
}
