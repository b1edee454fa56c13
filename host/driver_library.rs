//! Whether the CUDA driver library can be loaded, under any of cudarc's linking modes.
//!
//! cudarc's own probe (`is_culib_present`) exists only when it loads the driver at run time, and
//! which mode it is in is decided by the final build (candle links the driver instead). Asking the
//! dynamic loader directly works in every mode: with `dynamic-linking` the library is already
//! mapped into the process, with dynamic loading it is the library cudarc will open (each name
//! tried here is one of cudarc's candidates).

/// File names of the driver library, most specific first.
#[cfg(windows)]
const NAMES: &[&str] = &["nvcuda.dll"];
#[cfg(not(windows))]
const NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// True when the dynamic loader finds the CUDA driver library.
pub(crate) fn present() -> bool {
    NAMES.iter().any(|&name| {
        // SAFETY: loading the driver library runs only its initializers, which have no
        // preconditions; it is unloaded again when the handle drops.
        unsafe { libloading::Library::new(name) }.is_ok()
    })
}
