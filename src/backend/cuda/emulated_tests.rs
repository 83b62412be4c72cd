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
