//! The low floor every temper crate may use, and which uses no other temper crate but the
//! kernels: atomic files and folders ([`atomic_file`], [`atomic_dir`]), device names
//! ([`device`]), a free port ([`net`]), the Python temper runs ([`python`]) and seeds and hashes
//! ([`seed`]).
pub mod atomic_dir;
pub mod atomic_file;
pub mod device;
pub mod net;
pub mod python;
pub mod seed;
