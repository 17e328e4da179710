//! HTTP API tests (being written).
