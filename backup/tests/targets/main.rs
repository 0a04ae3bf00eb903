//! The targets through real I/O: a directory, full and read-only mounts, and S3 (moto).

mod directory;
mod mounts;
mod s3;
mod support;
