//! `#[kernel]`.
