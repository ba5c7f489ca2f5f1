//! Where CubeCL keeps what it compiles and measures: the CUDA backend's PTX of every kernel, and
//! the autotuner's choices (which matmul, convolution or reduction kernel is fastest per shape).
//!
//! Without a cache every run compiles every kernel again with NVRTC and tunes again, which costs
//! seconds to minutes before the first step. CubeCL's own default keeps no PTX and puts the
//! autotune results under the `target/` of whatever Cargo project the working directory is in,
//! so asrt sets both to one directory of its own, on by default:
//! `--kernel-cache DIR`, else `ASRT_KERNEL_CACHE`, else `$XDG_CACHE_HOME/asrt/kernels`, else
//! `$HOME/.cache/asrt/kernels`; `--kernel-cache off` (or the variable set to `off`) turns it off.
//! A `cubecl.toml` in the working directory (CubeCL's own configuration file) still wins for
//! whatever it sets. The same configuration carries CubeCL's memory log, where `ASRT_MEMORY_LOG`
//! names a file ([`log_memory`]).

use std::path::{Path, PathBuf};

/// The kernel cache of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelCache {
    /// Compiled kernels and autotune results are kept under this directory (`ptx/`, `autotune/`).
    Dir(PathBuf),
    /// Nothing is kept: every run compiles and tunes again.
    Off,
}

/// The word that turns the cache off.
pub const OFF: &str = "off";

impl KernelCache {
    /// The cache the flag, the environment (`ASRT_KERNEL_CACHE`, `XDG_CACHE_HOME`, `HOME`) and
    /// the defaults name, in that order. With none of them set, there is no cache.
    pub fn resolve(flag: Option<&Path>, env: &dyn Fn(&str) -> Option<String>) -> KernelCache {
        let named =
            |p: PathBuf| if p.as_os_str() == OFF { KernelCache::Off } else { KernelCache::Dir(p) };
        if let Some(p) = flag {
            return named(p.to_path_buf());
        }
        let set = |k: &str| env(k).filter(|v| !v.is_empty());
        if let Some(v) = set("ASRT_KERNEL_CACHE") {
            return named(PathBuf::from(v));
        }
        if let Some(v) = set("XDG_CACHE_HOME") {
            return KernelCache::Dir(Path::new(&v).join("asrt").join("kernels"));
        }
        match set("HOME") {
            Some(h) => KernelCache::Dir(Path::new(&h).join(".cache").join("asrt").join("kernels")),
            None => KernelCache::Off,
        }
    }

    /// The directory, if the cache is on.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            KernelCache::Dir(d) => Some(d),
            KernelCache::Off => None,
        }
    }
}

/// Why the kernel cache could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KernelCacheError {
    /// The directory cannot be made.
    #[error("kernel cache {dir}: cannot create it ({source}); choose another with --kernel-cache DIR, or --kernel-cache off")]
    Create {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl KernelCache {
    /// Makes the directory and sets CubeCL's process-wide configuration to use it, over
    /// `cubecl.toml` (if any) and CubeCL's environment variables, with the memory log
    /// `ASRT_MEMORY_LOG` names, if any ([`log_memory`]). CubeCL reads its configuration
    /// once, at the first kernel; when that has happened in this process already (an earlier
    /// run, or a test that ran kernels), the configuration stays as it is.
    pub fn install(&self) -> Result<(), KernelCacheError> {
        use burn_cubecl::cubecl::config::cache::CacheConfig;
        use burn_cubecl::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
        if let KernelCache::Dir(dir) = self {
            for sub in ["ptx", "autotune"] {
                let d = dir.join(sub);
                std::fs::create_dir_all(&d)
                    .map_err(|source| KernelCacheError::Create { dir: d, source })?;
            }
        }
        // Asked and set under one lock would be better, but CubeCL's `set` takes the lock itself:
        // the only race is with a kernel launched by another thread at this moment, and the
        // commands call this before any device exists.
        if CubeClRuntimeConfig::storage().lock().is_some() {
            return Ok(());
        }
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        match self {
            KernelCache::Dir(dir) => {
                if config.compilation.cache.is_none() {
                    config.compilation.cache = Some(CacheConfig::File(dir.join("ptx")));
                }
                // CubeCL's default (`Target`) is a Cargo project's target directory.
                if matches!(config.autotune.cache, CacheConfig::Target) {
                    config.autotune.cache = CacheConfig::File(dir.join("autotune"));
                }
            }
            KernelCache::Off => config.compilation.cache = None,
        }
        log_memory(&mut config, &|k| std::env::var(k).ok());
        CubeClRuntimeConfig::set(config);
        Ok(())
    }
}

/// The variable naming a file for CubeCL's memory log (`ASRT_MEMORY_LOG=FILE`): every buffer
/// the pool hands out, by size, and each time the pool takes a new page from the device, the
/// layout of all its pools (page size, largest slice, every page and how full it is). The
/// in-use and reserved figures say how much the pool keeps beyond the live buffers; this says
/// which pool keeps it, and for which sizes (`scripts/gpu/pool_summary.py` reads it). It is set
/// with the kernel cache, in CubeCL's process-wide configuration.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub const MEMORY_LOG: &str = "ASRT_MEMORY_LOG";

/// Sets `config` to write CubeCL's memory log to the file `ASRT_MEMORY_LOG` names (overwritten),
/// where `env` gives one that is not empty.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub fn log_memory(
    config: &mut burn_cubecl::cubecl::config::CubeClRuntimeConfig,
    env: &dyn Fn(&str) -> Option<String>,
) {
    use burn_cubecl::cubecl::config::memory::MemoryLogLevel;
    if let Some(file) = env(MEMORY_LOG).filter(|f| !f.is_empty()) {
        let logger = &mut config.memory.logger;
        logger.level = MemoryLogLevel::Full;
        logger.file = Some(file.into());
        logger.append = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn the_flag_then_the_variables_then_the_home_cache() {
        let all = [("ASRT_KERNEL_CACHE", "/a"), ("XDG_CACHE_HOME", "/x"), ("HOME", "/h")];
        let r = |flag: Option<&str>, vars: &[(&str, &str)]| {
            KernelCache::resolve(flag.map(Path::new), &env(vars))
        };
        assert_eq!(r(Some("/f"), &all), KernelCache::Dir("/f".into()));
        assert_eq!(r(Some("off"), &all), KernelCache::Off);
        assert_eq!(r(None, &all), KernelCache::Dir("/a".into()));
        assert_eq!(r(None, &[("ASRT_KERNEL_CACHE", "off"), ("HOME", "/h")]), KernelCache::Off);
        assert_eq!(r(None, &all[1..]), KernelCache::Dir("/x/asrt/kernels".into()));
        assert_eq!(
            r(None, &[("XDG_CACHE_HOME", ""), ("HOME", "/h")]),
            KernelCache::Dir("/h/.cache/asrt/kernels".into())
        );
        assert_eq!(r(None, &[]), KernelCache::Off);
    }

    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    #[test]
    fn the_memory_log_is_on_only_where_the_variable_names_a_file() {
        use burn_cubecl::cubecl::config::memory::MemoryLogLevel;
        use burn_cubecl::cubecl::config::CubeClRuntimeConfig;
        let set = |vars: &[(&str, &str)]| {
            let mut c = CubeClRuntimeConfig::default();
            log_memory(&mut c, &env(vars));
            c.memory.logger
        };
        let on = set(&[(MEMORY_LOG, "/tmp/m.log")]);
        assert!(matches!(on.level, MemoryLogLevel::Full));
        assert_eq!(on.file.as_deref(), Some(Path::new("/tmp/m.log")));
        assert!(!on.append, "a run's log starts empty");
        for vars in [&[(MEMORY_LOG, "")][..], &[]] {
            let off = set(vars);
            assert!(matches!(off.level, MemoryLogLevel::Disabled));
            assert!(off.file.is_none());
        }
    }
}
