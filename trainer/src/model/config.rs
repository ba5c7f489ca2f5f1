//! Model configuration: presets and NeMo-like names, overridable from TOML.

use serde::{Deserialize, Serialize};

/// Mel front end (NeMo `AudioToMelSpectrogramPreprocessor`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PreprocessorConfig {
    /// Sample rate (the corpus's: 16 kHz).
    pub sample_rate: u32,
    /// FFT length.
    pub n_fft: usize,
    /// Window length in samples (25 ms).
    pub window_size: usize,
    /// Hop in samples (10 ms).
    pub window_stride: usize,
    /// Mel bands.
    pub features: usize,
    /// Pre-emphasis coefficient (0: off).
    pub preemph: f64,
    /// Added before the log.
    pub log_zero_guard_value: f64,
    /// Gaussian dither amplitude in training (0: off).
    pub dither: f64,
}

impl Default for PreprocessorConfig {
    fn default() -> Self {
        PreprocessorConfig {
            sample_rate: 16_000,
            n_fft: 512,
            window_size: 400,
            window_stride: 160,
            features: 128,
            preemph: 0.97,
            log_zero_guard_value: 2f64.powi(-24),
            dither: 1e-5,
        }
    }
}

/// SpecAugment (NeMo `SpectrogramAugmentation`), training only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpecAugmentConfig {
    /// Frequency masks per utterance.
    pub freq_masks: usize,
    /// Widest frequency mask, in mel bands.
    pub freq_width: usize,
    /// Time masks per utterance.
    pub time_masks: usize,
    /// Widest time mask, as a fraction of the utterance's frames.
    pub time_width: f64,
}

impl Default for SpecAugmentConfig {
    fn default() -> Self {
        SpecAugmentConfig { freq_masks: 2, freq_width: 27, time_masks: 10, time_width: 0.05 }
    }
}

/// FastConformer encoder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncoderConfig {
    /// Model width.
    pub d_model: usize,
    /// Conformer layers.
    pub n_layers: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Feed-forward width.
    pub ff_dim: usize,
    /// Channels of the depthwise-striding subsampling convolutions.
    pub subsampling_conv_channels: usize,
    /// Time reduction (8: three stride-2 stages).
    pub subsampling_factor: usize,
    /// Depthwise convolution kernel of the convolution module.
    pub conv_kernel_size: usize,
    /// Dropout everywhere in the encoder.
    pub dropout: f64,
    /// Scale the subsampled input by sqrt(d_model).
    pub xscaling: bool,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        ModelConfig::parakeet_tdt_0_6b().encoder
    }
}

/// Prediction network (NeMo `RNNTDecoder`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PredictionConfig {
    /// Embedding and LSTM width.
    pub pred_hidden: usize,
    /// Stacked LSTM layers.
    pub pred_rnn_layers: usize,
}

impl Default for PredictionConfig {
    fn default() -> Self {
        PredictionConfig { pred_hidden: 640, pred_rnn_layers: 2 }
    }
}

/// Joint network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JointConfig {
    /// Hidden width.
    pub joint_hidden: usize,
}

impl Default for JointConfig {
    fn default() -> Self {
        JointConfig { joint_hidden: 640 }
    }
}

/// The whole model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Front end.
    pub preprocessor: PreprocessorConfig,
    /// SpecAugment.
    pub spec_augment: SpecAugmentConfig,
    /// Encoder.
    pub encoder: EncoderConfig,
    /// Prediction network.
    pub decoder: PredictionConfig,
    /// Joint.
    pub joint: JointConfig,
    /// TDT durations.
    pub durations: Vec<usize>,
    /// Greedy decoding emits at most this many labels on one frame (NeMo's
    /// `decoding.greedy.max_symbols`; Parakeet: 10); `None`: no limit.
    pub max_symbols: Option<usize>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig::parakeet_tdt_0_6b()
    }
}

impl ModelConfig {
    /// Parakeet-TDT-0.6B's shape.
    pub fn parakeet_tdt_0_6b() -> ModelConfig {
        ModelConfig {
            preprocessor: PreprocessorConfig::default(),
            spec_augment: SpecAugmentConfig::default(),
            encoder: EncoderConfig {
                d_model: 1024,
                n_layers: 24,
                n_heads: 8,
                ff_dim: 4096,
                subsampling_conv_channels: 256,
                subsampling_factor: 8,
                conv_kernel_size: 9,
                dropout: 0.1,
                xscaling: true,
            },
            decoder: PredictionConfig { pred_hidden: 640, pred_rnn_layers: 2 },
            joint: JointConfig { joint_hidden: 640 },
            durations: vec![0, 1, 2, 3, 4],
            max_symbols: Some(10),
        }
    }

    /// A model small enough to train on a CPU in tests.
    pub fn tiny() -> ModelConfig {
        ModelConfig {
            preprocessor: PreprocessorConfig { features: 64, ..PreprocessorConfig::default() },
            spec_augment: SpecAugmentConfig {
                freq_masks: 1,
                freq_width: 8,
                time_masks: 2,
                time_width: 0.05,
            },
            encoder: EncoderConfig {
                d_model: 96,
                n_layers: 2,
                n_heads: 4,
                ff_dim: 384,
                subsampling_conv_channels: 32,
                subsampling_factor: 8,
                conv_kernel_size: 9,
                dropout: 0.0,
                xscaling: true,
            },
            decoder: PredictionConfig { pred_hidden: 96, pred_rnn_layers: 1 },
            joint: JointConfig { joint_hidden: 96 },
            durations: vec![0, 1, 2, 3, 4],
            max_symbols: Some(10),
        }
    }

    /// A preset by name: `tiny` or `parakeet-tdt-0.6b`.
    pub fn preset(name: &str) -> Option<ModelConfig> {
        match name {
            "tiny" => Some(ModelConfig::tiny()),
            "parakeet-tdt-0.6b" | "parakeet_tdt_0_6b" => Some(ModelConfig::parakeet_tdt_0_6b()),
            _ => None,
        }
    }

    /// Checks the numbers fit together.
    pub fn validate(&self) -> Result<(), ModelConfigError> {
        let e = &self.encoder;
        if e.d_model == 0 || e.n_heads == 0 || !e.d_model.is_multiple_of(e.n_heads) {
            return Err(ModelConfigError::Heads { d_model: e.d_model, n_heads: e.n_heads });
        }
        if !e.subsampling_factor.is_power_of_two() || e.subsampling_factor < 2 {
            return Err(ModelConfigError::SubsamplingFactor(e.subsampling_factor));
        }
        if e.conv_kernel_size.is_multiple_of(2) {
            return Err(ModelConfigError::EvenConvKernel(e.conv_kernel_size));
        }
        // Dropout scales what it keeps by 1 / (1 - p): p = 1 would divide by zero.
        if !(0.0..1.0).contains(&e.dropout) {
            return Err(ModelConfigError::Dropout(e.dropout));
        }
        let p = &self.preprocessor;
        if p.window_size > p.n_fft || p.window_stride == 0 || p.features == 0 {
            return Err(ModelConfigError::Preprocessor {
                window_size: p.window_size,
                n_fft: p.n_fft,
                window_stride: p.window_stride,
                features: p.features,
            });
        }
        if self.decoder.pred_rnn_layers == 0 {
            return Err(ModelConfigError::NoPredictionLayers);
        }
        Ok(())
    }
}

/// Why a model configuration cannot be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelConfigError {
    /// The attention heads do not divide the model width.
    #[error("encoder.d_model {d_model} must be a positive multiple of n_heads {n_heads}")]
    Heads {
        /// `encoder.d_model`.
        d_model: usize,
        /// `encoder.n_heads`.
        n_heads: usize,
    },
    /// The subsampling factor is not a power of two of at least 2.
    #[error("encoder.subsampling_factor {0} must be a power of two >= 2")]
    SubsamplingFactor(usize),
    /// The convolution module's kernel has an even size (it must be centred).
    #[error("encoder.conv_kernel_size {0} must be odd")]
    EvenConvKernel(usize),
    /// The front end's window does not fit its FFT, or a size is zero.
    #[error(
        "preprocessor: need window_size <= n_fft, window_stride > 0, features > 0 \
         (got window_size {window_size}, n_fft {n_fft}, window_stride {window_stride}, \
         features {features})"
    )]
    Preprocessor {
        /// Window length in samples.
        window_size: usize,
        /// FFT size.
        n_fft: usize,
        /// Hop in samples.
        window_stride: usize,
        /// Mel bands.
        features: usize,
    },
    /// The prediction network has no LSTM layer.
    #[error("decoder.pred_rnn_layers must be at least 1")]
    NoPredictionLayers,
    /// The encoder's dropout probability lies outside `[0, 1)`.
    #[error("encoder.dropout {0} must lie in [0, 1)")]
    Dropout(f64),
}
