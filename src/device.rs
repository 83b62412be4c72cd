//! DLPack devices: `Device { kind, id }`, parsed from and printed as `kDLCUDA:0`-style strings.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The DLPack device types (`DLDeviceType`), with their numeric codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i32)]
pub enum DeviceType {
    /// `kDLCPU`: host memory.
    Cpu = 1,
    /// `kDLCUDA`: CUDA device memory.
    Cuda = 2,
    /// `kDLCUDAHost`: page-locked host memory allocated through CUDA.
    CudaHost = 3,
    /// `kDLOpenCL`: an OpenCL buffer.
    OpenCl = 4,
    /// `kDLVulkan`: Vulkan buffer memory.
    Vulkan = 7,
    /// `kDLMetal`: a Metal buffer (Apple GPUs).
    Metal = 8,
    /// `kDLVPI`: memory of NVIDIA's Vision Programming Interface.
    Vpi = 9,
    /// `kDLROCM`: ROCm (AMD GPU) device memory.
    Rocm = 10,
    /// `kDLROCMHost`: page-locked host memory allocated through ROCm.
    RocmHost = 11,
    /// `kDLExtDev`: reserved for devices defined outside DLPack.
    ExtDev = 12,
    /// `kDLCUDAManaged`: CUDA unified (managed) memory, reachable from host and device.
    CudaManaged = 13,
    /// `kDLOneAPI`: a SYCL/oneAPI unified shared memory allocation.
    OneApi = 14,
    /// `kDLWebGPU`: a WebGPU buffer.
    WebGpu = 15,
    /// `kDLHexagon`: Qualcomm Hexagon DSP memory.
    Hexagon = 16,
    /// `kDLMAIA`: Microsoft MAIA accelerator memory.
    Maia = 17,
    /// `kDLTrn`: AWS Trainium memory.
    Trn = 18,
    /// `kDLTPU`: TPU device memory.
    Tpu = 19,
    /// `kDLTPUHost`: host memory of a TPU host.
    TpuHost = 20,
}

const ALL: [DeviceType; 18] = [
    DeviceType::Cpu,
    DeviceType::Cuda,
    DeviceType::CudaHost,
    DeviceType::OpenCl,
    DeviceType::Vulkan,
    DeviceType::Metal,
    DeviceType::Vpi,
    DeviceType::Rocm,
    DeviceType::RocmHost,
    DeviceType::ExtDev,
    DeviceType::CudaManaged,
    DeviceType::OneApi,
    DeviceType::WebGpu,
    DeviceType::Hexagon,
    DeviceType::Maia,
    DeviceType::Trn,
    DeviceType::Tpu,
    DeviceType::TpuHost,
];

impl DeviceType {
    /// Every device type DLPack 1.3 defines.
    pub const ALL: &'static [DeviceType] = &ALL;

    /// The `kDL` name, as written in `dlpack.h`.
    pub fn name(self) -> &'static str {
        use DeviceType::*;
        match self {
            Cpu => "kDLCPU",
            Cuda => "kDLCUDA",
            CudaHost => "kDLCUDAHost",
            OpenCl => "kDLOpenCL",
            Vulkan => "kDLVulkan",
            Metal => "kDLMetal",
            Vpi => "kDLVPI",
            Rocm => "kDLROCM",
            RocmHost => "kDLROCMHost",
            ExtDev => "kDLExtDev",
            CudaManaged => "kDLCUDAManaged",
            OneApi => "kDLOneAPI",
            WebGpu => "kDLWebGPU",
            Hexagon => "kDLHexagon",
            Maia => "kDLMAIA",
            Trn => "kDLTrn",
            Tpu => "kDLTPU",
            TpuHost => "kDLTPUHost",
        }
    }

    /// The DLPack code (`DLDeviceType` value).
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The device type with DLPack code `code`.
    pub fn from_code(code: i32) -> Result<Self> {
        ALL.iter()
            .copied()
            .find(|t| t.code() == code)
            .ok_or_else(|| Error::InvalidDevice {
                text: code.to_string(),
                reason: "not a DLPack device type code".into(),
            })
    }

    /// Memory the host CPU can read and write directly (no device kernel needed).
    pub fn is_host_accessible(self) -> bool {
        matches!(
            self,
            DeviceType::Cpu | DeviceType::CudaHost | DeviceType::RocmHost | DeviceType::CudaManaged
        )
    }
}

/// A DLPack device: a type and an ordinal. Prints as `kDLCPU`, `kDLCUDA:1`, `kDLOneAPI:0`.
///
/// The ordinal is left out of the printed form for the host types (`kDLCPU`, `kDLCUDAHost`,
/// `kDLROCMHost`, `kDLTPUHost`) when it is 0, the protocol's default; parsing accepts both forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    /// The device type.
    pub kind: DeviceType,
    /// The ordinal among devices of that type (`>= 0`; 0 for the host).
    pub id: i32,
}

impl Device {
    /// The host CPU, `kDLCPU`.
    pub const CPU: Device = Device {
        kind: DeviceType::Cpu,
        id: 0,
    };

    /// A device of type `kind` with ordinal `id`.
    pub fn new(kind: DeviceType, id: i32) -> Result<Self> {
        if id < 0 {
            return Err(Error::InvalidDevice {
                text: format!("{}:{id}", kind.name()),
                reason: "the device id must be >= 0".into(),
            });
        }
        Ok(Device { kind, id })
    }

    /// `kDLCUDA:<id>`.
    ///
    /// # Panics
    /// When `id` is negative ([`Device::new`] returns an error instead).
    pub fn cuda(id: i32) -> Self {
        assert!(id >= 0, "a CUDA device id is >= 0, not {id}");
        Device {
            kind: DeviceType::Cuda,
            id,
        }
    }

    /// From the DLPack `(device_type, device_id)` pair.
    pub fn from_dlpack(device_type: i32, device_id: i32) -> Result<Self> {
        Device::new(DeviceType::from_code(device_type)?, device_id)
    }

    /// The DLPack `(device_type, device_id)` pair.
    pub fn to_dlpack(self) -> (i32, i32) {
        (self.kind.code(), self.id)
    }

    /// Whether the host CPU can read and write this memory directly.
    pub fn is_host_accessible(self) -> bool {
        self.kind.is_host_accessible()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = matches!(
            self.kind,
            DeviceType::Cpu | DeviceType::CudaHost | DeviceType::RocmHost | DeviceType::TpuHost
        );
        if host && self.id == 0 {
            f.write_str(self.kind.name())
        } else {
            write!(f, "{}:{}", self.kind.name(), self.id)
        }
    }
}

/// Frameworks' names for devices (torch's `cpu`, `cuda`, `xpu`; JAX's `gpu`), read as the
/// DLPack device types they mean.
const FRAMEWORK_NAMES: [(&str, DeviceType); 4] = [
    ("cpu", DeviceType::Cpu),
    ("cuda", DeviceType::Cuda),
    ("gpu", DeviceType::Cuda),
    ("xpu", DeviceType::OneApi),
];

/// A DLPack device name (`"kDLCPU"`, `"kDLCUDA:1"`, as [`Device`] prints) or a framework's
/// (`"cpu"`, `"cuda"`, `"cuda:1"`, `"gpu:0"`, `"xpu"`); a missing id is 0.
///
/// ```
/// use dlpart::{Device, DeviceType};
///
/// assert_eq!("kDLCUDA:1".parse::<Device>()?, Device::cuda(1));
/// assert_eq!("cuda:1".parse::<Device>()?, Device::cuda(1));
/// assert_eq!("cpu".parse::<Device>()?, Device::CPU);
/// assert!("cuda:-1".parse::<Device>().is_err());
/// # Ok::<(), dlpart::Error>(())
/// ```
impl FromStr for Device {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        Device::parse(text, true)
    }
}

impl Device {
    /// A DLPack device name only (`"kDLCPU"`, `"kDLCUDA:1"`), as the `__partitioned__`
    /// protocol's locations name devices; [`str::parse`] also reads frameworks' names.
    ///
    /// ```
    /// assert!(dlpart::Device::from_dlpack_name("kDLCUDA:1").is_ok());
    /// assert!(dlpart::Device::from_dlpack_name("cuda:1").is_err());
    /// ```
    pub fn from_dlpack_name(text: &str) -> Result<Self> {
        Device::parse(text, false)
    }

    fn parse(text: &str, framework_names: bool) -> Result<Self> {
        let bad = |reason: String| Error::InvalidDevice {
            text: text.to_string(),
            reason,
        };
        let (name, id) = match text.split_once(':') {
            Some((name, id)) => {
                if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad(format!(
                        "the device id {id:?} is not a non-negative integer"
                    )));
                }
                let id: i32 = id
                    .parse()
                    .map_err(|_| bad(format!("the device id {id} does not fit in 32 bits")))?;
                (name, id)
            }
            None => (text, 0),
        };
        let kind = ALL
            .iter()
            .copied()
            .find(|t| t.name() == name)
            .or_else(|| {
                FRAMEWORK_NAMES
                    .iter()
                    .find(|(n, _)| framework_names && *n == name)
                    .map(|&(_, t)| t)
            })
            .ok_or_else(|| {
                let hint = ALL
                    .iter()
                    .find(|t| {
                        t.name().eq_ignore_ascii_case(name)
                            || t.name()[3..].eq_ignore_ascii_case(name)
                    })
                    .map(|t| format!("; did you mean {:?}?", t.name()))
                    .unwrap_or_default();
                let or_framework = match framework_names {
                    true => ", or 'cpu', 'cuda', 'cuda:1'",
                    false => "",
                };
                bad(format!(
                    "expected a DLPack device name such as 'kDLCPU' or 'kDLCUDA:0'\
                     {or_framework}{hint}"
                ))
            })?;
        Device::new(kind, id).map_err(|_| bad("the device id must be >= 0".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "a CUDA device id is >= 0, not -1")]
    fn cuda_ids_are_not_negative() {
        Device::cuda(-1);
    }

    #[test]
    fn every_type_round_trips_through_its_name_and_code() {
        for &t in DeviceType::ALL {
            for id in [0, 1, 7] {
                let d = Device::new(t, id).unwrap();
                let s = format!("{t_name}:{id}", t_name = t.name());
                assert_eq!(s.parse::<Device>().unwrap(), d);
                assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
                let (code, i) = d.to_dlpack();
                assert_eq!(Device::from_dlpack(code, i).unwrap(), d);
            }
            assert_eq!(
                t.name().parse::<Device>().unwrap(),
                Device { kind: t, id: 0 }
            );
        }
    }

    #[test]
    fn framework_names_read_as_their_dlpack_devices() {
        for (text, want) in [
            ("cpu", Device::CPU),
            ("cpu:2", Device::new(DeviceType::Cpu, 2).unwrap()),
            ("cuda", Device::cuda(0)),
            ("cuda:1", Device::cuda(1)),
            ("gpu:3", Device::cuda(3)),
            ("xpu:1", Device::new(DeviceType::OneApi, 1).unwrap()),
        ] {
            assert_eq!(text.parse::<Device>().unwrap(), want, "{text}");
        }
    }

    #[test]
    fn host_devices_print_without_default_id() {
        assert_eq!(Device::CPU.to_string(), "kDLCPU");
        assert_eq!(Device::cuda(0).to_string(), "kDLCUDA:0");
        assert_eq!(
            "kDLCPU:1".parse::<Device>().unwrap().to_string(),
            "kDLCPU:1"
        );
        assert_eq!(
            "kDLOneAPI:0".parse::<Device>().unwrap().to_string(),
            "kDLOneAPI:0"
        );
        assert_eq!(Device::from_dlpack(14, 0).unwrap().kind, DeviceType::OneApi);
    }

    #[test]
    fn bad_strings_are_rejected_with_the_text() {
        for s in [
            "kDLCUDA:x",
            "Cuda",
            "cuda:-1",
            "cuda:+1",
            "cuda:",
            "",
            "kDLCPU:",
            "kDLCUDA:-1",
            "kDLcuda:0",
            "kDLCUDA:1:2",
        ] {
            let e = s.parse::<Device>().unwrap_err().to_string();
            assert!(e.contains(&format!("{s:?}")), "{e}");
        }
        let e = "CUDA".parse::<Device>().unwrap_err().to_string();
        assert!(e.contains("did you mean \"kDLCUDA\""), "{e}");
        let e = "cuda:99999999999"
            .parse::<Device>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("99999999999 does not fit in 32 bits"), "{e}");
        assert!(Device::from_dlpack(5, 0).is_err());
        assert!(Device::from_dlpack(99, 0).is_err());
    }
}
