//! (being built; see docs/architecture.md)
