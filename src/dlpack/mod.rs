//! DLPack import and export.
