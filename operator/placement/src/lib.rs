//! The placement engine (to be written).
