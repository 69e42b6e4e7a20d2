//! CUDA graphs: record a sequence of launches once, replay it with one call.
//!
//! Launches never allocate or synchronize, so any sequence of them on a device's stream
//! can be captured. Buffers and scalar arguments are baked into the graph: what changes
//! between replays must live in device memory (a position, a token), read by the kernels.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;

use super::{Device, RuntimeError};

/// A captured sequence of launches on one CUDA device.
pub struct Graph {
    graph: CudaGraph,
    device: Device,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("device", &self.device)
            .finish()
    }
}

impl Graph {
    /// Replays the graph on the device's stream (asynchronously, like a launch).
    pub fn launch(&self) -> Result<(), RuntimeError> {
        self.graph
            .launch()
            .map_err(RuntimeError::driver("launching a CUDA graph"))
    }

    /// The device the graph runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl Device {
    /// Captures the launches `record` makes on this device's stream into a [`Graph`]
    /// without running them.
    ///
    /// Fails on the CPU device, when `record` fails (the capture is ended and discarded
    /// first, so the stream stays usable), or when the driver rejects the capture: a
    /// failed capture is an error, never a silent fallback to eager launches. Run
    /// `record`'s launches once eagerly before capturing, so that kernels are loaded.
    ///
    /// A device has one stream, shared by every clone of the `Device`: while a capture
    /// is under way, no other thread may use the device (its work would be captured, or
    /// would invalidate the capture).
    pub fn capture<E: From<RuntimeError>>(
        &self,
        record: impl FnOnce() -> Result<(), E>,
    ) -> Result<Graph, E> {
        let Some(cuda) = self.as_cuda() else {
            return Err(RuntimeError::NoDevice {
                ordinal: None,
                detail: "CUDA graphs need a GPU; the CPU interpreter runs launches directly".into(),
            }
            .into());
        };
        let stream = cuda.stream();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(RuntimeError::driver("beginning stream capture"))?;
        let recorded = record();
        // End the capture whatever happened, so the stream is usable again.
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        recorded?;
        match ended.map_err(RuntimeError::driver("ending stream capture"))? {
            Some(graph) => Ok(Graph {
                graph,
                device: self.clone(),
            }),
            None => Err(RuntimeError::NoDevice {
                ordinal: Some(cuda.ordinal()),
                detail: "stream capture recorded no work".into(),
            }
            .into()),
        }
    }
}
