//! The CUDA backend's stand-in when dlpart is built without the `cuda` feature.
//!
//! It has the entry points of `backend::cuda` that the rest of the crate and the CUDA tests
//! call, so `ops`, the bindings and [`super::backend_for`] are written once, with no `cfg`.
//! Every entry point returns [`Error::BackendUnavailable`]; [`CudaBackend`] has no values (it
//! cannot be created), so its methods can never run. The driver-level parts (`nvrtc`,
//! `DeviceBuffer`, `DlpackStream`, the stream and context accessors) exist only in the real
//! module.

use std::sync::Arc;

use crate::backend::{Backend, BoxCopy};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The reason every entry point gives: the same words users saw before the stub existed.
fn unavailable() -> Error {
    Error::BackendUnavailable {
        backend: "cuda",
        reason: "dlpart was built without the `cuda` feature".into(),
    }
}

/// Always passes: without the backend no device can be counted, and using one gives
/// [`Error::BackendUnavailable`].
pub fn check_present(_device: Device) -> Result<()> {
    Ok(())
}

/// Always passes: without the backend dlpart cannot ask the driver, and a producer may still
/// put data on a GPU for dlpart to hold.
pub fn check_driver(_device: Device) -> Result<()> {
    Ok(())
}

/// 0: without the backend there are no pinned staging buffers to keep.
pub fn pinned_cache_limit() -> usize {
    0
}

/// The CUDA backend of a build without the `cuda` feature: a type with no values.
pub enum CudaBackend {}

impl CudaBackend {
    /// Always [`Error::BackendUnavailable`].
    pub fn shared(_device: Device) -> Result<Arc<dyn Backend>> {
        Err(unavailable())
    }

    /// Always [`Error::BackendUnavailable`].
    pub fn get(_device: Device) -> Result<Arc<CudaBackend>> {
        Err(unavailable())
    }

    /// Never runs: there is no `CudaBackend` to call it on.
    pub fn copy_host_to_device(&self, _src: &Tensor, _dst: &Tensor) -> Result<()> {
        match *self {}
    }

    /// Never runs: there is no `CudaBackend` to call it on.
    pub fn copy_device_to_host(&self, _src: &Tensor, _dst: &Tensor) -> Result<()> {
        match *self {}
    }

    /// Never runs: there is no `CudaBackend` to call it on.
    pub fn copy_device_to_device(&self, _src: &Tensor, _dst: &Tensor) -> Result<()> {
        match *self {}
    }

    /// Never runs: there is no `CudaBackend` to call it on.
    pub fn wait_for_producer(&self, _producer: Option<i64>) -> Result<()> {
        match *self {}
    }

    /// Never runs: there is no `CudaBackend` to call it on.
    pub fn host_wait_for(&self, _producer: Option<i64>) -> Result<()> {
        match *self {}
    }

    /// Never runs: there is no `CudaBackend` to call it on.
    pub fn release_staging(&self) {
        match *self {}
    }

    /// Never runs: there is no `CudaBackend` to call it on.
    pub fn kept_staging_bytes(&self) -> usize {
        match *self {}
    }
}

impl Backend for CudaBackend {
    fn device(&self) -> Device {
        match *self {}
    }

    fn empty(&self, _shape: &[usize], _dtype: DType) -> Result<Tensor> {
        match *self {}
    }

    fn empty_staging(&self, _shape: &[usize], _dtype: DType) -> Result<Tensor> {
        match *self {}
    }

    unsafe fn copy_boxes_unchecked(&self, _jobs: &[BoxCopy<'_>]) -> Result<()> {
        match *self {}
    }

    fn normalise_indices(&self, _indices: &Tensor, _axis: usize, _len: usize) -> Result<Tensor> {
        match *self {}
    }

    fn gather(&self, _src: &Tensor, _indices: &Tensor, _axis: usize, _out: &Tensor) -> Result<()> {
        match *self {}
    }

    fn scatter(
        &self,
        _values: &Tensor,
        _indices: &Tensor,
        _axis: usize,
        _out: &Tensor,
    ) -> Result<()> {
        match *self {}
    }

    fn transfer(&self, _src: &Tensor, _dst: &Tensor) -> Result<()> {
        match *self {}
    }

    fn dlpack_stream(&self) -> Option<i64> {
        match *self {}
    }

    fn make_consumer_wait(&self, _stream: Option<i64>) -> Result<()> {
        match *self {}
    }
}

/// Always [`Error::BackendUnavailable`].
pub fn copy_tensor(_src: &Tensor, _dst: &Tensor) -> Result<()> {
    Err(unavailable())
}

/// Always [`Error::BackendUnavailable`].
pub fn wait_on(_device: Device, _consumer: Option<i64>, _producer: Option<i64>) -> Result<()> {
    Err(unavailable())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_unavailable<T>(r: Result<T>) -> bool {
        matches!(
            r,
            Err(Error::BackendUnavailable { backend: "cuda", ref reason })
                if reason == "dlpart was built without the `cuda` feature"
        )
    }

    #[test]
    fn every_entry_point_is_unavailable() {
        let d = Device::cuda(0);
        let t = Tensor::from_slice(&[1i64, 2], &[2]).unwrap();
        assert!(is_unavailable(CudaBackend::shared(d)));
        assert!(is_unavailable(CudaBackend::get(d)));
        assert!(is_unavailable(copy_tensor(&t, &t)));
        assert!(is_unavailable(wait_on(d, None, Some(-1))));
        assert!(is_unavailable(crate::backend::backend_for(d)));
    }
}
