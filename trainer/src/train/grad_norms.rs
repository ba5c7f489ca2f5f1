//! Each parameter's gradient norm, step by step, into a JSON-lines file named by
//! `ASRT_GRAD_NORMS`: a diagnostic that tells which parameter's gradient differs between two
//! backends. The GPU kit's step cg sets a CUDA run's against the CPU's: on an H200 `tiny`'s
//! global norm was 1 % off at step 1 and twice the CPU's at step 2 (bench/RESULTS.md, "The step
//! on the device"), and the global norm does not say where.
//!
//! Invariants: one line per optimizer step, `{"step": N, "norms": [[path, norm], ...]}`, the
//! parameters in module order by their path (the fields and list indices Burn's visitor enters,
//! `encoder.layers.0.ff1.linear1.weight`); the norm in float64 over the gradient's values read
//! to the host, divided by the loss scale, so that it does not depend on the backend's own sums;
//! parameters without a gradient are left out; only rank 0 writes (the gradients it sees are
//! the sum over ranks). One read to the host per parameter: for a few steps, not a whole run.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

/// The environment variable naming the file.
pub const VAR: &str = "ASRT_GRAD_NORMS";

/// Why the norms could not be written.
#[derive(Debug, thiserror::Error)]
pub enum GradNormsError {
    /// The file could not be created.
    #[error("{VAR}: cannot create {path}: {source}")]
    Create {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A line could not be written.
    #[error("{VAR}: cannot write step {step} to {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The step.
        step: u64,
        /// The cause.
        source: std::io::Error,
    },
}

/// The file the norms go to, created at the first step written.
#[derive(Debug)]
pub struct GradNormLog {
    path: PathBuf,
    file: Option<BufWriter<File>>,
}

impl GradNormLog {
    /// The log `ASRT_GRAD_NORMS` names, if it is set and not empty.
    pub fn from_env() -> Option<Self> {
        let path = std::env::var_os(VAR).filter(|v| !v.is_empty())?;
        Some(GradNormLog { path: path.into(), file: None })
    }

    /// Writes step `step`'s norms as one line (flushed, so a run that stops keeps its lines).
    pub fn write(&mut self, step: u64, norms: &[(String, f64)]) -> Result<(), GradNormsError> {
        if self.file.is_none() {
            let file = File::create(&self.path)
                .map_err(|source| GradNormsError::Create { path: self.path.clone(), source })?;
            self.file = Some(BufWriter::new(file));
        }
        let line = serde_json::json!({ "step": step, "norms": norms });
        let written =
            self.file.as_mut().map_or(Ok(()), |f| writeln!(f, "{line}").and_then(|()| f.flush()));
        written.map_err(|source| GradNormsError::Write { path: self.path.clone(), step, source })
    }
}

/// Each gradient's norm in `grads` by its parameter's path in `module`, divided by `scale`
/// (see the module).
pub fn by_path<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &GradientsParams,
    scale: f64,
) -> Vec<(String, f64)> {
    /// The path entered so far and the norms found.
    struct Paths<'a> {
        grads: &'a GradientsParams,
        path: Vec<String>,
        scale: f64,
        out: Vec<(String, f64)>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Paths<'_> {
        fn enter_module(&mut self, name: &str, _container: &str) {
            self.path.push(name.to_owned());
        }

        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.path.pop();
        }

        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) else { return };
            let squares: f64 = g.into_data().iter::<f64>().map(|v| v * v).sum();
            self.out.push((self.path.join("."), squares.sqrt() / self.scale));
        }
    }
    let mut paths = Paths { grads, path: Vec::new(), scale, out: Vec::new() };
    module.visit(&mut paths);
    paths.out
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, NdArray};
    use burn::nn::{Linear, LinearConfig};

    type B = Autodiff<NdArray>;

    #[derive(Module, Debug)]
    struct Net<B: Backend> {
        first: Linear<B>,
        rest: Vec<Linear<B>>,
        frozen: Linear<B>,
    }

    /// For `y = x · W + b` summed, `dW[i, j] = x_i` and `db[j] = 1`: over `out` columns the
    /// norms are `sqrt(out * sum(x^2))` and `sqrt(out)`. The paths name the fields and list
    /// indices; a parameter without a gradient (not tracked) is left out; the scale divides.
    #[test]
    fn names_each_parameter_and_its_norm() {
        let device = Default::default();
        let net = Net::<B> {
            first: LinearConfig::new(3, 4).init(&device),
            rest: vec![
                LinearConfig::new(3, 2).init(&device),
                LinearConfig::new(3, 5).init(&device),
            ],
            frozen: LinearConfig::new(3, 2).init(&device).no_grad(),
        };
        let xs = [0.5f32, -2.0, 3.0];
        let x = Tensor::<B, 2>::from_floats([xs], &device);
        let y = net.first.forward(x.clone()).sum()
            + net.rest[0].forward(x.clone()).sum()
            + net.rest[1].forward(x.clone()).sum()
            + net.frozen.forward(x).sum();
        let grads = GradientsParams::from_grads(y.backward(), &net);
        let got = by_path(&net, &grads, 2.0);
        let sum_sq: f64 = xs.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let want = [
            ("first.weight", (4.0 * sum_sq).sqrt()),
            ("first.bias", 4f64.sqrt()),
            ("rest.0.weight", (2.0 * sum_sq).sqrt()),
            ("rest.0.bias", 2f64.sqrt()),
            ("rest.1.weight", (5.0 * sum_sq).sqrt()),
            ("rest.1.bias", 5f64.sqrt()),
        ];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for ((path, norm), (want_path, want_norm)) in got.iter().zip(want) {
            assert_eq!(path, want_path);
            // The values are exact in f32 and summed in float64.
            assert!((norm - want_norm / 2.0).abs() <= 1e-12 * want_norm, "{path}: {norm}");
        }
    }

    #[test]
    fn writes_one_line_per_step_and_names_a_file_it_cannot_create() {
        let dir = std::env::temp_dir().join(format!("asrt-grad-norms-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("norms.jsonl");
        let mut log = GradNormLog { path: path.clone(), file: None };
        log.write(1, &[("a.weight".into(), 1.5)]).unwrap();
        log.write(2, &[("a.weight".into(), 0.25), ("a.bias".into(), 2.0)]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["step"], 2);
        assert_eq!(lines[1]["norms"][1], serde_json::json!(["a.bias", 2.0]));
        let mut bad = GradNormLog { path: dir.join("missing/norms.jsonl"), file: None };
        let err = bad.write(1, &[]).unwrap_err().to_string();
        assert!(err.contains("ASRT_GRAD_NORMS") && err.contains("missing/norms.jsonl"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
