//! Devices, buffers and launches.
