//! Reading small results back from the device without stopping its stream.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, PinnedHostSlice};

use super::device::{Buffer, Device};
use super::element::Element;
use super::error::RuntimeError;

enum Slot<T> {
    Host(Vec<T>),
    /// The event marks the last queued copy's completion (recorded here: with event
    /// tracking off, as the runtime sets it for graph capture, cudarc records none).
    Pinned(PinnedHostSlice<T>, CudaEvent),
}

/// Page-locked host memory that a [`Buffer`]'s contents are copied into in stream
/// order: [`Readback::enqueue`] queues the copy behind the work queued so far and
/// returns at once, so more work (the next decode step) can be queued before
/// [`Readback::wait`] blocks for this copy alone.
///
/// On the CPU device the copy happens in `enqueue`.
///
/// ```
/// use tilefuse_dsl::runtime::Device;
///
/// let dev = Device::cpu();
/// let buf = dev.upload(&[3i32, 4]).unwrap();
/// let mut rb = dev.readback::<i32>(2).unwrap();
/// rb.enqueue(&buf).unwrap();
/// assert_eq!(rb.wait().unwrap(), &[3, 4]);
/// ```
pub struct Readback<T: Element> {
    device: Device,
    slot: Slot<T>,
}

impl<T: Element> std::fmt::Debug for Readback<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Readback<{}>[{}]", T::DTYPE, self.len())
    }
}

impl Device {
    /// Host memory for reading back `len` elements (zeros until the first copy).
    pub fn readback<T: Element>(&self, len: usize) -> Result<Readback<T>, RuntimeError> {
        let slot = match self.as_cuda() {
            None => Slot::Host(vec![T::default(); len]),
            Some(cuda) => {
                // SAFETY: the memory is zeroed below before anything reads it (`T` is
                // valid as zero bits); plain (cached) page-locked memory, since the
                // host reads it.
                let mut pinned = unsafe { cuda.context().alloc_pinned_with_flags::<T>(len, 0) }
                    .map_err(RuntimeError::driver("allocating page-locked host memory"))?;
                pinned
                    .as_mut_slice()
                    .map_err(RuntimeError::driver("initializing page-locked host memory"))?
                    .fill(T::default());
                let done = cuda
                    .context()
                    .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map_err(RuntimeError::driver("creating a readback event"))?;
                Slot::Pinned(pinned, done)
            }
        };
        Ok(Readback {
            device: self.clone(),
            slot,
        })
    }
}

impl<T: Element> Readback<T> {
    /// Elements held.
    pub fn len(&self) -> usize {
        match &self.slot {
            Slot::Host(v) => v.len(),
            Slot::Pinned(p, _) => p.len(),
        }
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues a copy of the first [`Readback::len`] elements of `src` behind the work
    /// queued on `src`'s device so far. `src` must live on the device this was made
    /// for and hold at least that many elements.
    pub fn enqueue(&mut self, src: &Buffer<T>) -> Result<(), RuntimeError> {
        let len = self.len();
        if src.device() != &self.device {
            return Err(RuntimeError::WrongDevice {
                what: format!(
                    "a readback ({}) and its source buffer ({})",
                    self.device,
                    src.device()
                ),
            });
        }
        if src.len() < len {
            return Err(RuntimeError::LengthMismatch {
                buffer: src.len(),
                host: len,
            });
        }
        match (&mut self.slot, src.cuda_slice(), src.as_host_slice()) {
            (Slot::Host(v), _, Some(h)) => {
                v.copy_from_slice(&h[..len]);
                Ok(())
            }
            (Slot::Pinned(p, done), Some(s), _) => {
                if len == 0 {
                    return Ok(());
                }
                let stream = s.stream().clone();
                stream
                    .memcpy_dtoh(&s.slice(..len), p)
                    .map_err(RuntimeError::driver(
                        "queueing a copy to page-locked memory",
                    ))?;
                done.record(&stream)
                    .map_err(RuntimeError::driver("recording a readback event"))
            }
            _ => Err(RuntimeError::WrongDevice {
                what: "a readback and its source buffer".into(),
            }),
        }
    }

    /// Waits for the last queued copy (not for work queued after it) and returns the
    /// data.
    pub fn wait(&self) -> Result<&[T], RuntimeError> {
        match &self.slot {
            Slot::Host(v) => Ok(v),
            Slot::Pinned(p, done) => {
                done.synchronize().map_err(RuntimeError::driver(
                    "waiting for a copy to page-locked memory",
                ))?;
                p.as_slice()
                    .map_err(RuntimeError::driver("reading page-locked memory"))
            }
        }
    }
}
