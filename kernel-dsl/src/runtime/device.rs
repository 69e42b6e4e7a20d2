//! Devices and buffers.

use std::collections::HashMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr};

use super::element::{as_bytes, as_bytes_mut, Element};
use super::error::RuntimeError;
use crate::ir::DType;

/// Library names probed before the driver API is touched.
const DRIVER_LIBS: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// Whether the CUDA driver library can be loaded. Never panics.
fn probe_driver() -> Result<(), String> {
    let mut errors = Vec::new();
    for name in DRIVER_LIBS {
        // SAFETY: loading the NVIDIA driver runs its initializers, which is what the
        // driver bindings would do on first use anyway.
        match unsafe { libloading::Library::new(name) } {
            Ok(_lib) => return Ok(()),
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    Err(errors.join("; "))
}

/// Runs a driver-binding call, turning a panic inside the bindings into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, RuntimeError>) -> Result<T, RuntimeError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(RuntimeError::DriverPanic {
                what: what.into(),
                message,
            })
        }
    }
}

/// The number of CUDA devices, or why there are none.
fn device_count() -> Result<usize, RuntimeError> {
    probe_driver().map_err(|detail| RuntimeError::NoDriver { detail })?;
    guarded("counting devices", || {
        CudaContext::device_count()
            .map(|n| n.max(0) as usize)
            .map_err(|e| RuntimeError::NoDevice {
                ordinal: None,
                detail: format!("cuInit/cuDeviceGetCount failed: {e}"),
            })
    })
}

/// Whether a CUDA device is usable: the driver library loads and reports at least one
/// device. Never panics; the answer is computed once per process.
pub fn cuda_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| matches!(device_count(), Ok(n) if n > 0))
}

/// A CUDA GPU: a context, the stream every launch and copy goes to, and the kernels
/// loaded into the context so far.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    name: String,
    compute_capability: (i32, i32),
    /// Loaded functions, keyed by the address of their `'static` [`super::Variant`], so
    /// a cached launch looks up without allocating.
    pub(crate) functions: Mutex<HashMap<usize, CudaFunction>>,
    /// Ordinals of the devices whose memory kernels of this one may access
    /// ([`Device::enable_peer_access`]).
    peers: Mutex<Vec<usize>>,
}

impl CudaDevice {
    /// The driver context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream all launches and copies on this device are ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// `(major, minor)` compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The GPU's name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether launches use programmatic dependent launch: on Hopper and newer (where
    /// the sm_90 PTX waits for its predecessor itself), unless `TILEFUSE_PDL=0`.
    ///
    /// A kernel then starts while its predecessor finishes: loads placed above
    /// `wait_for_prior_kernels()` (weights) overlap the predecessor's tail, and each
    /// launch's ramp-up overlaps the one before (about 5% of a Qwen3-0.6B decode step
    /// on an H100, docs/perf.md). `TILEFUSE_PDL=0` gives plain stream order, to bisect.
    pub fn programmatic_launch(&self) -> bool {
        static ENABLED: OnceLock<bool> = OnceLock::new();
        self.compute_capability.0 >= 9
            && *ENABLED.get_or_init(|| std::env::var("TILEFUSE_PDL").map_or(true, |v| v != "0"))
    }
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("compute_capability", &self.compute_capability)
            .finish()
    }
}

/// Where kernels run and buffers live.
///
/// Cloning is cheap. `Device::cuda(n)` returns the same device (context, stream, loaded
/// kernels) every time it is called with the same ordinal.
#[derive(Clone, Debug)]
pub enum Device {
    /// The host: kernels run on the reference interpreter, synchronously.
    Cpu,
    /// A CUDA GPU.
    Cuda(Arc<CudaDevice>),
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Cpu, Device::Cpu) => true,
            (Device::Cuda(a), Device::Cuda(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Device {}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(d) => write!(f, "cuda:{}", d.ordinal),
        }
    }
}

impl Device {
    /// The CPU (interpreter) device.
    pub fn cpu() -> Device {
        Device::Cpu
    }

    /// The CUDA device with this ordinal.
    ///
    /// Returns an error, never panics, when the driver or the device is missing.
    pub fn cuda(ordinal: usize) -> Result<Device, RuntimeError> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
        let devices = DEVICES.get_or_init(Default::default);
        let mut devices = devices.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = devices.get(&ordinal) {
            return Ok(Device::Cuda(d.clone()));
        }
        let count = device_count()?;
        if ordinal >= count {
            return Err(RuntimeError::NoDevice {
                ordinal: Some(ordinal),
                detail: format!("the driver reports {count} device(s)"),
            });
        }
        let dev = guarded("creating a CUDA context", || {
            let ctx =
                CudaContext::new(ordinal).map_err(RuntimeError::driver("creating a context"))?;
            // SAFETY: all work of this runtime is ordered on one stream per device, so
            // cudarc's cross-stream events are not needed; without them launches record
            // no events and can be captured into CUDA graphs.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx
                .new_stream()
                .map_err(RuntimeError::driver("creating a stream"))?;
            let name = ctx
                .name()
                .map_err(RuntimeError::driver("querying the device name"))?;
            let compute_capability = ctx
                .compute_capability()
                .map_err(RuntimeError::driver("querying the compute capability"))?;
            Ok(CudaDevice {
                ctx,
                stream,
                ordinal,
                name,
                compute_capability,
                functions: Mutex::new(HashMap::new()),
                peers: Mutex::new(Vec::new()),
            })
        })?;
        let dev = Arc::new(dev);
        devices.insert(ordinal, dev.clone());
        Ok(Device::Cuda(dev))
    }

    /// CUDA device 0 if one is usable, else the CPU.
    ///
    /// Setting the environment variable `TILEFUSE_DEVICE=cpu` forces the CPU.
    pub fn auto() -> Device {
        if std::env::var("TILEFUSE_DEVICE").is_ok_and(|v| v.eq_ignore_ascii_case("cpu")) {
            return Device::Cpu;
        }
        if cuda_available() {
            if let Ok(d) = Device::cuda(0) {
                return d;
            }
        }
        Device::Cpu
    }

    /// Whether this is a CUDA device.
    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    /// The CUDA device, if this is one.
    pub fn as_cuda(&self) -> Option<&Arc<CudaDevice>> {
        match self {
            Device::Cuda(d) => Some(d),
            Device::Cpu => None,
        }
    }

    /// A human-readable name: `cpu (interpreter)` or the GPU's name.
    pub fn name(&self) -> String {
        match self {
            Device::Cpu => "cpu (interpreter)".into(),
            Device::Cuda(d) => d.name.clone(),
        }
    }

    /// Lets kernels launched on this device read and write `peer`'s memory directly
    /// (over NVLink or PCIe): afterwards a buffer of `peer` may be passed to a launch
    /// on this device ([`Device::reaches`]), as the plain device address it has in
    /// the process's unified address space. Returns `false`, changing nothing, when the
    /// hardware cannot (`cuDeviceCanAccessPeer`), or when either device is the CPU or
    /// both are the same device. One direction only: call it on both sides for an
    /// exchange.
    pub fn enable_peer_access(&self, peer: &Device) -> Result<bool, RuntimeError> {
        use cudarc::driver::sys;
        let (Device::Cuda(me), Device::Cuda(other)) = (self, peer) else {
            return Ok(false);
        };
        if Arc::ptr_eq(me, other) {
            return Ok(false);
        }
        let mut peers = me.peers.lock().unwrap_or_else(|e| e.into_inner());
        if peers.contains(&other.ordinal) {
            return Ok(true);
        }
        let mut can = 0;
        // SAFETY: valid device handles and an out-pointer to a local.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, me.ctx.cu_device(), other.ctx.cu_device()) }
            .result()
            .map_err(RuntimeError::driver(
                "asking whether peer access is possible",
            ))?;
        if can == 0 {
            return Ok(false);
        }
        me.ctx
            .bind_to_thread()
            .map_err(RuntimeError::driver("binding the context"))?;
        // SAFETY: the current context is this device's; the peer's is valid.
        let r = unsafe { sys::cuCtxEnablePeerAccess(other.ctx.cu_ctx(), 0) };
        if r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            r.result().map_err(RuntimeError::driver(format!(
                "enabling access from cuda:{} to cuda:{}",
                me.ordinal, other.ordinal
            )))?;
        }
        // Buffers come from the peer's stream-ordered memory pool (`cuMemAllocAsync`),
        // which peer access alone does not open: without this, a kernel reading one
        // faulted with an illegal address (docs/gpu-results.md).
        let mut pool = std::ptr::null_mut();
        // SAFETY: a valid device handle and an out-pointer to a local.
        unsafe { sys::cuDeviceGetMemPool(&mut pool, other.ctx.cu_device()) }
            .result()
            .map_err(RuntimeError::driver("finding the peer's memory pool"))?;
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: me.ordinal as i32,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: a valid pool and one access descriptor.
        unsafe { sys::cuMemPoolSetAccess(pool, &access, 1) }
            .result()
            .map_err(RuntimeError::driver(format!(
                "opening cuda:{}'s memory pool to cuda:{}",
                other.ordinal, me.ordinal
            )))?;
        peers.push(other.ordinal);
        Ok(true)
    }

    /// Whether kernels launched on this device may use buffers of `other`: the same
    /// device, or a GPU whose memory this one was given access to
    /// ([`Device::enable_peer_access`]).
    pub fn reaches(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Cuda(me), Device::Cuda(o)) if !Arc::ptr_eq(me, o) => me
                .peers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&o.ordinal),
            _ => self == other,
        }
    }

    /// Waits for all work queued on this device. A no-op on the CPU.
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(d) => d
                .stream
                .synchronize()
                .map_err(RuntimeError::driver("synchronizing the stream")),
        }
    }

    /// Copies host data into a new buffer on this device.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<Buffer<T>, RuntimeError> {
        let storage = match self {
            Device::Cpu => Storage::Host(data.to_vec()),
            Device::Cuda(d) => {
                let slice = if data.is_empty() {
                    d.stream.null()
                } else {
                    d.stream.clone_htod(data)
                };
                Storage::Cuda(slice.map_err(RuntimeError::driver(format!(
                    "uploading {} elements of {}",
                    data.len(),
                    T::DTYPE
                )))?)
            }
        };
        Ok(Buffer {
            device: self.clone(),
            storage,
        })
    }

    /// A new buffer of `len` copies of `value` (for example NaN, to poison outputs).
    pub fn alloc_filled<T: Element>(
        &self,
        len: usize,
        value: T,
    ) -> Result<Buffer<T>, RuntimeError> {
        self.upload(&vec![value; len])
    }

    /// A new buffer of `len` zeros.
    pub fn zeros<T: Element>(&self, len: usize) -> Result<Buffer<T>, RuntimeError> {
        match self {
            Device::Cpu => self.upload(&vec![T::default(); len]),
            Device::Cuda(d) => {
                let slice = if len == 0 {
                    d.stream.null()
                } else {
                    d.stream.alloc_zeros(len)
                };
                let slice = slice.map_err(RuntimeError::driver(format!(
                    "allocating {len} elements of {}",
                    T::DTYPE
                )))?;
                Ok(Buffer {
                    device: self.clone(),
                    storage: Storage::Cuda(slice),
                })
            }
        }
    }
}

enum Storage<T> {
    Host(Vec<T>),
    Cuda(CudaSlice<T>),
}

/// Elements of type `T` on one [`Device`].
///
/// Copies to and from the host go through the device's stream; [`Buffer::to_vec`] waits
/// for queued work first.
pub struct Buffer<T: Element> {
    device: Device,
    storage: Storage<T>,
}

impl<T: Element> fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer<{}>[{}] on {}", T::DTYPE, self.len(), self.device)
    }
}

impl<T: Element> Buffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.storage {
            Storage::Host(v) => v.len(),
            Storage::Cuda(s) => s.len(),
        }
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device the buffer lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The element dtype.
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    /// Copies the contents to the host, after all work queued on the device.
    pub fn to_vec(&self) -> Result<Vec<T>, RuntimeError> {
        match &self.storage {
            Storage::Host(v) => Ok(v.clone()),
            Storage::Cuda(s) => {
                if s.is_empty() {
                    return Ok(Vec::new());
                }
                let stream = s.stream();
                let v = stream
                    .clone_dtoh(s)
                    .map_err(RuntimeError::driver("copying a buffer to the host"))?;
                stream.synchronize().map_err(RuntimeError::driver(
                    "synchronizing after a copy to the host",
                ))?;
                Ok(v)
            }
        }
    }

    /// Overwrites the contents with `data`, which must have the same length.
    ///
    /// On a GPU the copy is queued on the device's stream (stream-ordered, no allocation).
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<(), RuntimeError> {
        if data.len() != self.len() {
            return Err(RuntimeError::LengthMismatch {
                buffer: self.len(),
                host: data.len(),
            });
        }
        match &mut self.storage {
            Storage::Host(v) => {
                v.copy_from_slice(data);
                Ok(())
            }
            Storage::Cuda(s) => {
                if data.is_empty() {
                    return Ok(());
                }
                let stream = s.stream().clone();
                stream
                    .memcpy_htod(data, s)
                    .map_err(RuntimeError::driver("copying host data into a buffer"))
            }
        }
    }

    /// The host elements, for a CPU buffer.
    pub fn as_host_slice(&self) -> Option<&[T]> {
        match &self.storage {
            Storage::Host(v) => Some(v),
            Storage::Cuda(_) => None,
        }
    }

    /// The device memory, for a CUDA buffer (for interop with other CUDA libraries).
    pub fn cuda_slice(&self) -> Option<&CudaSlice<T>> {
        match &self.storage {
            Storage::Cuda(s) => Some(s),
            Storage::Host(_) => None,
        }
    }

    /// The device memory, mutably, for a CUDA buffer.
    pub fn cuda_slice_mut(&mut self) -> Option<&mut CudaSlice<T>> {
        match &mut self.storage {
            Storage::Cuda(s) => Some(s),
            Storage::Host(_) => None,
        }
    }
}

/// A buffer with its element type erased, as a launch sees it.
pub(crate) trait ErasedBuffer {
    fn dtype(&self) -> DType;
    fn len(&self) -> usize;
    fn device(&self) -> &Device;
    fn host_bytes(&self) -> Option<&[u8]>;
    fn host_bytes_mut(&mut self) -> Option<&mut [u8]>;
    /// The raw device address, for a CUDA buffer.
    fn device_addr(&self) -> Option<u64>;
}

/// A buffer read as elements of another type: the same bytes, `len` elements of `dtype`
/// ([`crate::runtime::KernelArg::read_as`]).
pub(crate) struct Reinterpreted<'a> {
    pub(crate) inner: &'a dyn ErasedBuffer,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
}

impl ErasedBuffer for Reinterpreted<'_> {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn len(&self) -> usize {
        self.len
    }

    fn device(&self) -> &Device {
        self.inner.device()
    }

    fn host_bytes(&self) -> Option<&[u8]> {
        self.inner.host_bytes()
    }

    fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        // Read only: `KernelArg::read_as` passes it for reading.
        None
    }

    fn device_addr(&self) -> Option<u64> {
        self.inner.device_addr()
    }
}

impl<T: Element> ErasedBuffer for Buffer<T> {
    fn dtype(&self) -> DType {
        T::DTYPE
    }

    fn len(&self) -> usize {
        Buffer::len(self)
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn host_bytes(&self) -> Option<&[u8]> {
        self.as_host_slice().map(as_bytes)
    }

    fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.storage {
            Storage::Host(v) => Some(as_bytes_mut(v)),
            Storage::Cuda(_) => None,
        }
    }

    fn device_addr(&self) -> Option<u64> {
        match &self.storage {
            Storage::Cuda(s) => {
                // Event tracking is off for our contexts, so this records nothing.
                let (ptr, _sync) = s.device_ptr(s.stream());
                Some(ptr)
            }
            Storage::Host(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_does_not_panic() {
        // On machines without a driver this must be `false` and quiet; with one, either.
        let available = cuda_available();
        if probe_driver().is_err() {
            assert!(!available);
            let err = Device::cuda(0).unwrap_err();
            assert!(
                err.to_string()
                    .contains("no CUDA driver found (libcuda.so.1)"),
                "{err}"
            );
        }
        assert_eq!(cuda_available(), available);
    }

    #[test]
    fn auto_falls_back_to_cpu() {
        let d = Device::auto();
        assert_eq!(
            d.is_cuda(),
            cuda_available() && std::env::var("TILEFUSE_DEVICE").is_err()
        );
        if !d.is_cuda() {
            assert_eq!(d.name(), "cpu (interpreter)");
            assert_eq!(d, Device::cpu());
        }
    }

    #[test]
    fn cpu_buffers_round_trip() {
        let d = Device::cpu();
        d.synchronize().unwrap();
        let b = d.upload(&[1.5f32, -2.0, 3.25]).unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(b.dtype(), DType::F32);
        assert_eq!(b.device(), &Device::Cpu);
        assert_eq!(b.to_vec().unwrap(), vec![1.5, -2.0, 3.25]);

        let z = d.zeros::<half::bf16>(4).unwrap();
        assert_eq!(z.to_vec().unwrap(), vec![half::bf16::ZERO; 4]);

        let mut p = d.alloc_filled(2, f32::NAN).unwrap();
        assert!(p.to_vec().unwrap().iter().all(|x| x.is_nan()));
        p.copy_from_host(&[1.0, 2.0]).unwrap();
        assert_eq!(p.to_vec().unwrap(), vec![1.0, 2.0]);
        let err = p.copy_from_host(&[1.0]).unwrap_err();
        assert!(err.to_string().contains("buffer holds 2 elements"), "{err}");

        let e = d.upload::<u8>(&[]).unwrap();
        assert!(e.is_empty());
        assert_eq!(ErasedBuffer::host_bytes(&e), Some(&[][..]));
        assert_eq!(format!("{b:?}"), "Buffer<f32>[3] on cpu");
    }

    #[test]
    fn cuda_buffers_round_trip() {
        let _turn = crate::runtime::testing::gpu_turn();
        let Some(d) = crate::runtime::testing::gpu_or_skip("cuda_buffers_round_trip") else {
            return;
        };
        let b = d.upload(&[1i32, 2, 3]).unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![1, 2, 3]);
        let z = d.zeros::<half::f16>(5).unwrap();
        assert_eq!(z.to_vec().unwrap(), vec![half::f16::ZERO; 5]);
        let mut e = d.upload::<u8>(&[]).unwrap();
        assert!(e.to_vec().unwrap().is_empty());
        e.copy_from_host(&[]).unwrap();
        assert_eq!(Device::cuda(0).unwrap(), d);
        assert_ne!(d, Device::Cpu);
        assert!(d.as_cuda().unwrap().compute_capability().0 >= 7);
    }
}
