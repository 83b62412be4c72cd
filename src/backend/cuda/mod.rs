//! The CUDA backend (feature `cuda`).
