//! What a CUDA run needs from the machine, checked before the first CUDA call, so that a missing
//! piece is an error naming what to fix instead of a panic on a device thread or a hang:
//!
//! - the driver (`libcuda.so`), and every ordinal asked for below its device count;
//! - NVRTC (`libnvrtc.so`), which CubeCL compiles kernels with at run time, not newer than the
//!   driver: PTX written by a newer NVRTC is refused by an older driver
//!   (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, NVIDIA's "CUDA Compatibility" guide);
//! - the toolkit's headers, which those kernels include (`cuda_runtime.h`, `cuda_fp16.h`,
//!   `cuda_bf16.h`, and CCCL's `cuda/pipeline`, under `include/cccl` since CUDA 13). CubeCL looks
//!   in `$CUDA_PATH`, else `/usr/local/cuda`, `/opt/cuda`, or `/usr` when `/usr/bin/nvcc`
//!   exists, and panics at the first kernel when none is there; this module looks in the same
//!   places first;
//! - NCCL when ranks sum gradients (several devices, or several processes). cudarc opens
//!   `libnccl.so` and never `libnccl.so.2`, the only name pip's `nvidia-nccl-cu*` wheels ship.
//!   When only `libnccl.so.2` loads, asrt links `libnccl.so` to it in its cache directory and
//!   runs itself again with that directory first on `LD_LIBRARY_PATH` (the dynamic loader reads
//!   the variable once, at start-up, so a running process cannot add to it).
//!
//! The decisions are plain functions over what was found (tested without a GPU); the
//! `cuda`-feature `prepare` finds it.

use std::path::{Path, PathBuf};

/// Why the machine cannot run CUDA work.
#[derive(Debug, thiserror::Error)]
pub enum CudaEnvError {
    /// The driver library cannot be loaded.
    #[error(
        "the NVIDIA driver's libcuda could not be loaded (tried {tried:?}): install the driver, \
         or put the folder holding libcuda.so.1 on LD_LIBRARY_PATH"
    )]
    NoDriver {
        /// The file names tried.
        tried: Vec<String>,
    },
    /// The driver loaded but did not start.
    #[error("the CUDA driver did not start: {0} (is a GPU visible? nvidia-smi lists them; CUDA_VISIBLE_DEVICES hides them)")]
    DriverInit(String),
    /// An ordinal the machine does not have.
    #[error("cuda:{ordinal}: this machine has {count} CUDA device(s) (cuda:0 to cuda:{last})", last = count.saturating_sub(1))]
    MissingOrdinal {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices the driver sees.
        count: usize,
    },
    /// NVRTC cannot be loaded.
    #[error(
        "NVRTC (CUDA's run-time compiler) could not be loaded (tried {tried:?}): put the CUDA \
         toolkit's lib64 (or pip's nvidia-cuda-nvrtc lib folder) on LD_LIBRARY_PATH"
    )]
    NoNvrtc {
        /// The file names tried.
        tried: Vec<String>,
    },
    /// NVRTC writes PTX the driver cannot load.
    #[error(
        "NVRTC {}.{} is newer than the driver's CUDA {}.{}: the driver would refuse the PTX it \
         writes (CUDA_ERROR_UNSUPPORTED_PTX_VERSION). Put an NVRTC of CUDA {}.{} or older first \
         on LD_LIBRARY_PATH (the toolkit's lib64 usually matches), or update the driver",
        nvrtc.0, nvrtc.1, driver.0, driver.1, driver.0, driver.1
    )]
    NvrtcNewer {
        /// NVRTC's (major, minor).
        nvrtc: (i32, i32),
        /// The driver's CUDA (major, minor).
        driver: (i32, i32),
    },
    /// No toolkit directory.
    #[error(
        "CUDA toolkit not found (tried {tried:?}): kernels are compiled at run time and include \
         its headers. Set CUDA_PATH to the toolkit's root (the folder holding include/cuda_runtime.h)"
    )]
    NoToolkit {
        /// The directories tried.
        tried: Vec<PathBuf>,
    },
    /// A toolkit directory without the headers kernels include.
    #[error(
        "CUDA toolkit {root} ({from}) has no {missing}: kernels are compiled at run time and \
         include it. Set CUDA_PATH to a complete toolkit's root"
    )]
    NoHeaders {
        /// The toolkit's root.
        root: PathBuf,
        /// How it was found.
        from: ToolkitFrom,
        /// The header missing (relative to `include/`).
        missing: &'static str,
    },
    /// NCCL cannot be loaded under any name.
    #[error(
        "NCCL could not be loaded (tried {tried:?}): several ranks sum gradients with it. \
         Install it (pip install nvidia-nccl-cu13, or the distribution's libnccl2) and put the \
         folder holding libnccl.so.2 on LD_LIBRARY_PATH"
    )]
    NoNccl {
        /// The file names tried.
        tried: Vec<String>,
    },
    /// `libnccl.so.2` loaded but its file could not be found or linked.
    #[error("NCCL: {what}: {source}; link libnccl.so to libnccl.so.2 in a folder on LD_LIBRARY_PATH yourself")]
    NcclAlias {
        /// What failed.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// Still no `libnccl.so` after running again with the link first on the path.
    #[error(
        "NCCL: {dir} is first on LD_LIBRARY_PATH and links libnccl.so, yet NCCL does not load"
    )]
    NcclAliasIgnored {
        /// The link's folder.
        dir: PathBuf,
    },
}

/// How the toolkit directory was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolkitFrom {
    /// `$CUDA_PATH`.
    CudaPath,
    /// One of CubeCL's default places.
    Default,
}

impl std::fmt::Display for ToolkitFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ToolkitFrom::CudaPath => "from CUDA_PATH",
            ToolkitFrom::Default => "CUDA_PATH unset, found in a default place",
        })
    }
}

/// Headers every kernel build includes, relative to `include/`.
pub const HEADERS: [&str; 3] = ["cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h"];
/// A CCCL header (libcu++), in `include/` up to CUDA 12 and `include/cccl/` from CUDA 13.
pub const CCCL_HEADER: &str = "cuda/pipeline";

/// The toolkit root CubeCL will use, found the way CubeCL finds it, with its headers checked.
pub fn find_toolkit(
    cuda_path: Option<&Path>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<(PathBuf, ToolkitFrom), CudaEnvError> {
    let (root, from) = match cuda_path {
        Some(p) => (p.to_path_buf(), ToolkitFrom::CudaPath),
        None => {
            let defaults = [Path::new("/usr/local/cuda"), Path::new("/opt/cuda")];
            let found = defaults
                .iter()
                .find(|p| exists(p))
                .map(|p| p.to_path_buf())
                .or_else(|| exists(Path::new("/usr/bin/nvcc")).then(|| PathBuf::from("/usr")));
            match found {
                Some(p) => (p, ToolkitFrom::Default),
                None => {
                    let mut tried: Vec<PathBuf> =
                        defaults.iter().map(|p| p.to_path_buf()).collect();
                    tried.push("/usr (with /usr/bin/nvcc)".into());
                    return Err(CudaEnvError::NoToolkit { tried });
                }
            }
        }
    };
    let include = root.join("include");
    for h in HEADERS {
        if !exists(&include.join(h)) {
            return Err(CudaEnvError::NoHeaders { root, from, missing: h });
        }
    }
    if !exists(&include.join(CCCL_HEADER)) && !exists(&include.join("cccl").join(CCCL_HEADER)) {
        return Err(CudaEnvError::NoHeaders {
            root,
            from,
            missing: "cuda/pipeline (or cccl/cuda/pipeline)",
        });
    }
    Ok((root, from))
}

/// Checks every ordinal against the driver's device count.
pub fn check_ordinals(ordinals: &[usize], count: usize) -> Result<(), CudaEnvError> {
    match ordinals.iter().find(|&&o| o >= count) {
        Some(&ordinal) => Err(CudaEnvError::MissingOrdinal { ordinal, count }),
        None => Ok(()),
    }
}

/// A CUDA version number as the driver and NVRTC APIs give it (`13000`) as (major, minor).
pub fn cuda_version(code: i32) -> (i32, i32) {
    (code / 1000, (code % 1000) / 10)
}

/// Refuses an NVRTC newer than the driver.
pub fn check_nvrtc(nvrtc: (i32, i32), driver: (i32, i32)) -> Result<(), CudaEnvError> {
    if nvrtc > driver {
        return Err(CudaEnvError::NvrtcNewer { nvrtc, driver });
    }
    Ok(())
}

/// The versioned file name NCCL's packages ship.
pub const NCCL_SONAME: &str = "libnccl.so.2";
/// The variable naming the folder of a `libnccl.so` link, set when asrt runs itself again.
pub const NCCL_LINK_VAR: &str = "ASRT_NCCL_LINK_DIR";

/// How NCCL can be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NcclLookup {
    /// Under a name cudarc tries.
    Found,
    /// Only as `libnccl.so.2`: it needs the link.
    SonameOnly,
    /// Not at all.
    Missing(Vec<String>),
}

/// Whether NCCL loads under the names cudarc tries (`candidates`) or only as `libnccl.so.2`.
pub fn nccl_lookup(candidates: &[String], loads: &dyn Fn(&str) -> bool) -> NcclLookup {
    if candidates.iter().any(|c| loads(c)) {
        NcclLookup::Found
    } else if loads(NCCL_SONAME) {
        NcclLookup::SonameOnly
    } else {
        let mut tried = candidates.to_vec();
        tried.push(NCCL_SONAME.into());
        NcclLookup::Missing(tried)
    }
}

/// The files mapped into a process, from its `/proc/PID/maps` text (the sixth field).
pub fn mapped_files(maps: &str) -> impl Iterator<Item = &Path> {
    maps.lines().filter_map(|l| l.split_whitespace().nth(5)).map(Path::new)
}

/// The path of a loaded library named `file`, from `/proc/self/maps`' text.
pub fn loaded_path(maps: &str, file: &str) -> Option<PathBuf> {
    mapped_files(maps).find(|p| p.file_name().is_some_and(|n| n == file)).map(Path::to_path_buf)
}

/// `LD_LIBRARY_PATH` with `dir` first.
pub fn library_path_with(dir: &Path, old: Option<&str>) -> String {
    match old.filter(|o| !o.is_empty()) {
        Some(o) => format!("{}:{o}", dir.display()),
        None => dir.display().to_string(),
    }
}

#[cfg(feature = "cuda")]
pub use probe::prepare;

#[cfg(feature = "cuda")]
mod probe {
    use super::*;

    fn loads(name: &str) -> bool {
        // SAFETY: loading runs the library's initialisers; these are NVIDIA's CUDA libraries,
        // which cudarc loads the same way moments later.
        unsafe { libloading::Library::new(name) }.is_ok()
    }

    /// Checks the driver, the ordinals, NVRTC and the toolkit, and with `nccl` makes NCCL
    /// loadable (running this program again when only `libnccl.so.2` exists: this function
    /// then does not return). `link_dir` is where the `libnccl.so` link goes.
    pub fn prepare(ordinals: &[usize], nccl: bool, link_dir: &Path) -> Result<(), CudaEnvError> {
        // SAFETY: as in `loads`; the checks only ask whether a library loads.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CudaEnvError::NoDriver { tried: cudarc::get_lib_name_candidates("cuda") });
        }
        cudarc::driver::result::init().map_err(|e| CudaEnvError::DriverInit(format!("{e:?}")))?;
        let count = cudarc::driver::result::device::get_count()
            .map_err(|e| CudaEnvError::DriverInit(format!("{e:?}")))?;
        check_ordinals(ordinals, usize::try_from(count).unwrap_or(0))?;
        let mut driver = 0;
        // SAFETY: a plain out-parameter call on the loaded driver.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) }
            .result()
            .map_err(|e| CudaEnvError::DriverInit(format!("{e:?}")))?;
        // SAFETY: as in `loads`.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CudaEnvError::NoNvrtc { tried: cudarc::get_lib_name_candidates("nvrtc") });
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: plain out-parameter calls on the loaded library.
        unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| CudaEnvError::DriverInit(format!("NVRTC: {e:?}")))?;
        check_nvrtc((major, minor), cuda_version(driver))?;
        let cuda_path = std::env::var_os("CUDA_PATH").map(PathBuf::from);
        find_toolkit(cuda_path.as_deref(), &|p| p.exists())?;
        if nccl {
            make_nccl_loadable(link_dir)?;
        }
        Ok(())
    }

    fn make_nccl_loadable(link_dir: &Path) -> Result<(), CudaEnvError> {
        let candidates = cudarc::get_lib_name_candidates("nccl");
        match nccl_lookup(&candidates, &loads) {
            NcclLookup::Found => Ok(()),
            NcclLookup::Missing(tried) => Err(CudaEnvError::NoNccl { tried }),
            NcclLookup::SonameOnly => {
                if let Some(dir) = std::env::var_os(NCCL_LINK_VAR) {
                    return Err(CudaEnvError::NcclAliasIgnored { dir: dir.into() });
                }
                let alias = |what: String| move |source| CudaEnvError::NcclAlias { what, source };
                // Held while the maps are read: `loads` closed it again, which unmaps it.
                // SAFETY: as in `loads`.
                let _held = unsafe { libloading::Library::new(NCCL_SONAME) }.map_err(|e| {
                    alias(format!("loading {NCCL_SONAME}"))(std::io::Error::other(e))
                })?;
                let maps = std::fs::read_to_string("/proc/self/maps")
                    .map_err(alias("reading /proc/self/maps".into()))?;
                let target =
                    loaded_path(&maps, NCCL_SONAME).ok_or_else(|| CudaEnvError::NcclAlias {
                        what: format!("{NCCL_SONAME} loaded but is not in /proc/self/maps"),
                        source: std::io::ErrorKind::NotFound.into(),
                    })?;
                std::fs::create_dir_all(link_dir)
                    .map_err(alias(format!("creating {}", link_dir.display())))?;
                let link = link_dir.join("libnccl.so");
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(&target, &link).map_err(alias(format!(
                    "linking {} to {}",
                    link.display(),
                    target.display()
                )))?;
                eprintln!(
                    "asrt: NCCL is only {}; running again with {} -> it first on LD_LIBRARY_PATH",
                    target.display(),
                    link.display()
                );
                let old = std::env::var("LD_LIBRARY_PATH").ok();
                let exe = std::env::current_exe().map_err(alias("finding this program".into()))?;
                use std::os::unix::process::CommandExt;
                let err = std::process::Command::new(exe)
                    .args(std::env::args_os().skip(1))
                    .env("LD_LIBRARY_PATH", library_path_with(link_dir, old.as_deref()))
                    .env(NCCL_LINK_VAR, link_dir)
                    .exec();
                Err(CudaEnvError::NcclAlias { what: "running again".into(), source: err })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toolkit_is_found_where_cubecl_looks_and_its_headers_checked() {
        let files =
            |list: &'static [&'static str]| move |p: &Path| list.iter().any(|f| Path::new(f) == p);
        let cuda13: &[&str] = &[
            "/usr/local/cuda",
            "/usr/local/cuda/include/cuda_runtime.h",
            "/usr/local/cuda/include/cuda_fp16.h",
            "/usr/local/cuda/include/cuda_bf16.h",
            "/usr/local/cuda/include/cccl/cuda/pipeline",
        ];
        let (root, from) = find_toolkit(None, &files(cuda13)).unwrap();
        assert_eq!((root, from), (PathBuf::from("/usr/local/cuda"), ToolkitFrom::Default));
        // CUDA_PATH wins, and is checked, not passed over.
        let e = find_toolkit(Some(Path::new("/opt/tk")), &files(cuda13)).unwrap_err();
        assert!(
            matches!(e, CudaEnvError::NoHeaders { ref root, from: ToolkitFrom::CudaPath, missing: "cuda_runtime.h" } if root == Path::new("/opt/tk")),
            "{e}"
        );
        assert!(e.to_string().contains("CUDA_PATH"), "{e}");
        // No CCCL headers in either place.
        let e = find_toolkit(None, &files(&cuda13[..4])).unwrap_err();
        assert!(
            matches!(e, CudaEnvError::NoHeaders { missing, .. } if missing.starts_with("cuda/pipeline")),
            "{e}"
        );
        // Nothing at all.
        let e = find_toolkit(None, &|_| false).unwrap_err();
        assert!(matches!(&e, CudaEnvError::NoToolkit { tried } if tried.len() == 3), "{e}");
        assert!(e.to_string().contains("Set CUDA_PATH"), "{e}");
        // nvcc in /usr/bin: the distribution's toolkit, CUDA 12's layout.
        let distro: &[&str] = &[
            "/usr/bin/nvcc",
            "/usr/include/cuda_runtime.h",
            "/usr/include/cuda_fp16.h",
            "/usr/include/cuda_bf16.h",
            "/usr/include/cuda/pipeline",
        ];
        assert_eq!(find_toolkit(None, &files(distro)).unwrap().0, PathBuf::from("/usr"));
    }

    #[test]
    fn ordinals_versions_and_nccl_names() {
        assert!(check_ordinals(&[0], 1).is_ok());
        let e = check_ordinals(&[0, 2], 2).unwrap_err();
        assert!(matches!(e, CudaEnvError::MissingOrdinal { ordinal: 2, count: 2 }));
        assert_eq!(e.to_string(), "cuda:2: this machine has 2 CUDA device(s) (cuda:0 to cuda:1)");
        assert_eq!(cuda_version(13000), (13, 0));
        assert_eq!(cuda_version(12090), (12, 9));
        assert!(check_nvrtc((13, 0), (13, 0)).is_ok());
        assert!(check_nvrtc((12, 8), (13, 0)).is_ok());
        assert!(matches!(
            check_nvrtc((13, 2), (13, 0)),
            Err(CudaEnvError::NvrtcNewer { nvrtc: (13, 2), driver: (13, 0) })
        ));

        let candidates = vec!["libnccl.so".to_string(), "libnccl.so.13".to_string()];
        assert_eq!(nccl_lookup(&candidates, &|n| n == "libnccl.so"), NcclLookup::Found);
        assert_eq!(nccl_lookup(&candidates, &|n| n == "libnccl.so.2"), NcclLookup::SonameOnly);
        assert_eq!(
            nccl_lookup(&candidates, &|_| false),
            NcclLookup::Missing(vec![
                "libnccl.so".into(),
                "libnccl.so.13".into(),
                "libnccl.so.2".into()
            ])
        );
        let maps = "7f00-7f10 r-xp 00000000 08:01 123 /venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2\n\
                    7f20-7f30 r--p 00000000 00:00 0 [heap]\n";
        assert_eq!(
            loaded_path(maps, "libnccl.so.2"),
            Some(PathBuf::from("/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"))
        );
        assert_eq!(loaded_path(maps, "libnccl.so"), None);
        assert_eq!(library_path_with(Path::new("/c"), Some("/a:/b")), "/c:/a:/b");
        assert_eq!(library_path_with(Path::new("/c"), Some("")), "/c");
    }
}
