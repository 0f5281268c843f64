//! libtorch's profiler (Kineto, what `torch.profiler.profile` runs) around a stretch of work,
//! saved as a Chrome trace (`csrc/profiler.cpp`): open it in chrome://tracing or Perfetto.

use std::ffi::{c_char, c_int, CString};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::take_error;

extern "C" {
    fn temper_profiler_start(cuda: c_int, err: *mut *mut c_char) -> c_int;
    fn temper_profiler_stop(path: *const c_char, err: *mut *mut c_char) -> c_int;
}

/// A running profile: every op of this process with its input shapes (and CUDA kernels when
/// asked), until [`Profile::save`].
pub struct Profile {
    saved: bool,
}

impl Profile {
    pub fn start(cuda: bool) -> Result<Profile> {
        let mut err = std::ptr::null_mut();
        // SAFETY: err is written by the callee on failure.
        if unsafe { temper_profiler_start(c_int::from(cuda), &mut err) } != 0 {
            bail!("starting libtorch's profiler: {}", take_error(err));
        }
        Ok(Profile { saved: false })
    }

    /// Stops the profiler and writes its Chrome trace to `path` (libtorch writes the file).
    pub fn save(mut self, path: &Path) -> Result<()> {
        // An unusable path returns before the stop: dropping `self` then stops the profiler.
        let c = CString::new(path.to_string_lossy().as_bytes())
            .with_context(|| format!("{}: a path with a NUL byte", path.display()))?;
        self.saved = true;
        let mut err = std::ptr::null_mut();
        // SAFETY: `c` outlives the call; err is written by the callee on failure.
        if unsafe { temper_profiler_stop(c.as_ptr(), &mut err) } != 0 {
            bail!(
                "writing the profile {}: {}",
                path.display(),
                take_error(err)
            );
        }
        Ok(())
    }
}

impl Drop for Profile {
    /// A profile dropped unsaved (an error in the profiled step) still stops the profiler.
    fn drop(&mut self) {
        if !self.saved {
            let mut err = std::ptr::null_mut();
            let devnull = CString::new("/dev/null").expect("no NUL");
            // SAFETY: as in `save`.
            if unsafe { temper_profiler_stop(devnull.as_ptr(), &mut err) } != 0 {
                let _ = take_error(err);
            }
        }
    }
}
