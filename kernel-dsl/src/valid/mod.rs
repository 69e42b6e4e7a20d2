//! Type and shape inference, and validation of typed kernels.
