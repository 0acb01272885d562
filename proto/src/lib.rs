//! The resource-layer gRPC API (to be written).
