//! The decode engine.
