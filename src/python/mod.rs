//! The `dlpart._core` Python extension module.
