//! The resource layer (to be written).
