//! Element types and their DLPack `DLDataType` codes.

use std::fmt;
use std::str::FromStr;

use dlpack_rs::ffi::{DLDataType, DLDataTypeCode as C};

use crate::error::{Error, Result};

/// The element types dlpart moves. Float8 types have no arithmetic here; they are copied by
/// item size like every other type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `bool`: one byte, 0 or 1.
    Bool,
    /// `int8`: signed 8-bit integer.
    Int8,
    /// `int16`: signed 16-bit integer.
    Int16,
    /// `int32`: signed 32-bit integer.
    Int32,
    /// `int64`: signed 64-bit integer.
    Int64,
    /// `uint8`: unsigned 8-bit integer.
    UInt8,
    /// `uint16`: unsigned 16-bit integer.
    UInt16,
    /// `uint32`: unsigned 32-bit integer.
    UInt32,
    /// `uint64`: unsigned 64-bit integer.
    UInt64,
    /// `float16`: IEEE 754 half precision.
    Float16,
    /// `float32`: IEEE 754 single precision.
    Float32,
    /// `float64`: IEEE 754 double precision.
    Float64,
    /// `bfloat16`: the upper 16 bits of a `float32`.
    BFloat16,
    /// `complex64`: two `float32` (real, imaginary).
    Complex64,
    /// `complex128`: two `float64` (real, imaginary).
    Complex128,
    /// `float8_e3m4`: 3 exponent and 4 mantissa bits, IEEE-style infinities and NaN.
    Float8E3M4,
    /// `float8_e4m3`: 4 exponent and 3 mantissa bits, IEEE-style infinities and NaN.
    Float8E4M3,
    /// `float8_e4m3b11fnuz`: as `float8_e4m3fnuz` with exponent bias 11.
    Float8E4M3B11Fnuz,
    /// `float8_e4m3fn`: 4 exponent and 3 mantissa bits, finite, NaN only at all-ones.
    Float8E4M3Fn,
    /// `float8_e4m3fnuz`: 4 exponent and 3 mantissa bits, finite, no negative zero (its
    /// pattern is NaN).
    Float8E4M3Fnuz,
    /// `float8_e5m2`: 5 exponent and 2 mantissa bits, IEEE-style infinities and NaN.
    Float8E5M2,
    /// `float8_e5m2fnuz`: 5 exponent and 2 mantissa bits, finite, no negative zero.
    Float8E5M2Fnuz,
    /// `float8_e8m0fnu`: an unsigned power of two (8 exponent bits), as used for block
    /// scales.
    Float8E8M0Fnu,
}

use DType::*;

/// (dtype, name, DLPack code, bits)
const TABLE: [(DType, &str, u32, u8); 23] = [
    (Bool, "bool", C::kDLBool, 8),
    (Int8, "int8", C::kDLInt, 8),
    (Int16, "int16", C::kDLInt, 16),
    (Int32, "int32", C::kDLInt, 32),
    (Int64, "int64", C::kDLInt, 64),
    (UInt8, "uint8", C::kDLUInt, 8),
    (UInt16, "uint16", C::kDLUInt, 16),
    (UInt32, "uint32", C::kDLUInt, 32),
    (UInt64, "uint64", C::kDLUInt, 64),
    (Float16, "float16", C::kDLFloat, 16),
    (Float32, "float32", C::kDLFloat, 32),
    (Float64, "float64", C::kDLFloat, 64),
    (BFloat16, "bfloat16", C::kDLBfloat, 16),
    (Complex64, "complex64", C::kDLComplex, 64),
    (Complex128, "complex128", C::kDLComplex, 128),
    (Float8E3M4, "float8_e3m4", C::kDLFloat8_e3m4, 8),
    (Float8E4M3, "float8_e4m3", C::kDLFloat8_e4m3, 8),
    (
        Float8E4M3B11Fnuz,
        "float8_e4m3b11fnuz",
        C::kDLFloat8_e4m3b11fnuz,
        8,
    ),
    (Float8E4M3Fn, "float8_e4m3fn", C::kDLFloat8_e4m3fn, 8),
    (Float8E4M3Fnuz, "float8_e4m3fnuz", C::kDLFloat8_e4m3fnuz, 8),
    (Float8E5M2, "float8_e5m2", C::kDLFloat8_e5m2, 8),
    (Float8E5M2Fnuz, "float8_e5m2fnuz", C::kDLFloat8_e5m2fnuz, 8),
    (Float8E8M0Fnu, "float8_e8m0fnu", C::kDLFloat8_e8m0fnu, 8),
];

impl DType {
    /// Every supported dtype.
    pub fn all() -> impl Iterator<Item = DType> {
        TABLE.iter().map(|r| r.0)
    }

    fn row(self) -> &'static (DType, &'static str, u32, u8) {
        TABLE
            .iter()
            .find(|r| r.0 == self)
            .expect("every dtype has a row")
    }

    /// The numpy-style name: `float32`, `bfloat16`, `float8_e4m3fn`.
    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// Whether this integer type is signed: `Some(true)` for `int*`, `Some(false)` for
    /// `uint*`, `None` for every other type (bool included).
    pub fn signed_integer(self) -> Option<bool> {
        match self.row().2 {
            C::kDLInt => Some(true),
            C::kDLUInt => Some(false),
            _ => None,
        }
    }

    /// Whether this is an integer type of indices, signed or not; else the error naming it.
    pub(crate) fn index_signed(self) -> Result<bool> {
        self.signed_integer()
            .ok_or(Error::IndexDType { found: self })
    }

    /// Bytes per element.
    pub fn itemsize(self) -> usize {
        self.row().3 as usize / 8
    }

    /// The DLPack `DLDataType` (one lane).
    pub fn to_dlpack(self) -> DLDataType {
        let r = self.row();
        DLDataType {
            code: r.2 as u8,
            bits: r.3,
            lanes: 1,
        }
    }

    /// From a DLPack `DLDataType`; vector lanes and sub-byte types are refused.
    pub fn from_dlpack(dt: DLDataType) -> Result<Self> {
        let err = |reason| Error::UnsupportedDType {
            code: dt.code,
            bits: dt.bits,
            lanes: dt.lanes,
            reason,
        };
        if dt.lanes != 1 {
            return Err(err("only lanes == 1 is supported"));
        }
        // numpy < 1.25 and some producers send bool as an 8-bit unsigned "bool" code only;
        // DLPack defines kDLBool with 8 bits. Anything else is looked up exactly.
        TABLE
            .iter()
            .find(|r| r.2 == dt.code as u32 && r.3 == dt.bits)
            .map(|r| r.0)
            .ok_or_else(|| {
                if (dt.code as u32) > C::kDLBcomplex {
                    err("unknown type code")
                } else {
                    err("no dlpart dtype has this code and bit width")
                }
            })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        TABLE
            .iter()
            .find(|r| r.1 == s)
            .map(|r| r.0)
            .ok_or_else(|| Error::shape("unknown dtype name", format!("{s:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_dlpack_and_name() {
        for d in DType::all() {
            assert_eq!(DType::from_dlpack(d.to_dlpack()).unwrap(), d);
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            assert_eq!(d.itemsize() * 8, d.to_dlpack().bits as usize);
        }
        assert_eq!(DType::Complex128.itemsize(), 16);
        assert_eq!(DType::BFloat16.itemsize(), 2);
        assert_eq!(DType::Float8E4M3Fn.itemsize(), 1);
    }

    #[test]
    fn integers_say_whether_they_are_signed_by_their_names() {
        for d in DType::all() {
            let want = match d.name() {
                n if n.starts_with("int") => Some(true),
                n if n.starts_with("uint") => Some(false),
                _ => None,
            };
            assert_eq!(d.signed_integer(), want, "{d}");
            assert_eq!(d.index_signed().ok(), want, "{d}");
        }
        // A TypeError in Python, as numpy.take raises for a float or bool index array.
        let e = DType::Bool.index_signed().unwrap_err();
        assert!(
            matches!(e, Error::IndexDType { found: DType::Bool }),
            "{e:?}"
        );
        assert_eq!(e.kind(), "TypeError");
        assert_eq!(e.to_string(), "indices must be integers, found dtype bool");
    }

    #[test]
    fn refuses_lanes_and_unknown_codes_naming_them() {
        let e = DType::from_dlpack(DLDataType {
            code: 2,
            bits: 32,
            lanes: 4,
        })
        .unwrap_err();
        assert!(e.to_string().contains("lanes=4"), "{e}");
        let e = DType::from_dlpack(DLDataType {
            code: 2,
            bits: 24,
            lanes: 1,
        })
        .unwrap_err();
        assert!(e.to_string().contains("bits=24"), "{e}");
        let e = DType::from_dlpack(DLDataType {
            code: 99,
            bits: 8,
            lanes: 1,
        })
        .unwrap_err();
        assert!(e.to_string().contains("code=99"), "{e}");
        // kDLFloat4_e2m1fn is a sub-byte type dlpart does not move.
        assert!(DType::from_dlpack(DLDataType {
            code: 17,
            bits: 4,
            lanes: 1
        })
        .is_err());
    }
}
