//! Writes a PyTorch state dict file (`torch.save`'s zip container) of f32 and i64 tensors.
//!
//! The container: `<root>/data.pkl` (a pickle, protocol 2, of an `OrderedDict` from key to
//! `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)`, each
//! storage a persistent id `('storage', FloatStorage|LongStorage, '<n>', 'cpu', numel)`),
//! `<root>/data/<n>` (each storage's little-endian bytes, stored uncompressed and 64-byte
//! aligned as PyTorch writes them), `<root>/byteorder` and `<root>/version`. Only the globals
//! `torch.load(weights_only=True)` allows are referenced. Reading is Burn's (burn-store).

use std::io::{Seek, Write};

/// One tensor of a state dict.
#[derive(Debug, Clone, PartialEq)]
pub enum TorchTensor {
    /// Float32 values, row-major.
    F32 {
        /// Sizes.
        shape: Vec<usize>,
        /// Values.
        values: Vec<f32>,
    },
    /// Int64 values (BatchNorm's `num_batches_tracked`).
    I64 {
        /// Sizes.
        shape: Vec<usize>,
        /// Values.
        values: Vec<i64>,
    },
}

impl TorchTensor {
    fn shape(&self) -> &[usize] {
        match self {
            TorchTensor::F32 { shape, .. } | TorchTensor::I64 { shape, .. } => shape,
        }
    }

    fn numel(&self) -> usize {
        match self {
            TorchTensor::F32 { values, .. } => values.len(),
            TorchTensor::I64 { values, .. } => values.len(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        match self {
            TorchTensor::F32 { values, .. } => {
                values.iter().flat_map(|v| v.to_le_bytes()).collect()
            }
            TorchTensor::I64 { values, .. } => {
                values.iter().flat_map(|v| v.to_le_bytes()).collect()
            }
        }
    }

    fn storage_class(&self) -> &'static str {
        match self {
            TorchTensor::F32 { .. } => "FloatStorage",
            TorchTensor::I64 { .. } => "LongStorage",
        }
    }
}

/// A pickle (protocol 2) being written.
struct Pickle(Vec<u8>);

impl Pickle {
    fn global(&mut self, module: &str, name: &str) {
        self.0.push(b'c');
        self.0.extend_from_slice(module.as_bytes());
        self.0.push(b'\n');
        self.0.extend_from_slice(name.as_bytes());
        self.0.push(b'\n');
    }

    fn string(&mut self, s: &str) {
        self.0.push(b'X'); // BINUNICODE
        self.0.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
    }

    fn int(&mut self, v: usize) {
        if let Ok(v) = i32::try_from(v) {
            self.0.push(b'J'); // BININT
            self.0.extend_from_slice(&v.to_le_bytes());
        } else {
            // LONG1: little-endian two's complement, 8 bytes (always non-negative here).
            self.0.extend_from_slice(&[0x8a, 8]);
            self.0.extend_from_slice(&(v as u64).to_le_bytes());
        }
    }

    fn int_tuple(&mut self, values: &[usize]) {
        self.0.push(b'(');
        for &v in values {
            self.int(v);
        }
        self.0.push(b't');
    }

    fn empty_ordered_dict(&mut self) {
        self.global("collections", "OrderedDict");
        self.0.extend_from_slice(b")R"); // EMPTY_TUPLE, REDUCE
    }
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Writes `tensors` (key order kept) as a PyTorch state dict under archive root `root`.
pub fn write_state_dict<W: Write + Seek>(
    out: W,
    root: &str,
    tensors: &[(String, TorchTensor)],
) -> zip::result::ZipResult<W> {
    let mut p = Pickle(vec![0x80, 2]); // PROTO 2
    p.empty_ordered_dict();
    p.0.push(b'('); // MARK for SETITEMS
    for (i, (key, t)) in tensors.iter().enumerate() {
        p.string(key);
        p.global("torch._utils", "_rebuild_tensor_v2");
        p.0.push(b'(');
        p.0.push(b'(');
        p.string("storage");
        p.global("torch", t.storage_class());
        p.string(&i.to_string());
        p.string("cpu");
        p.int(t.numel());
        p.0.extend_from_slice(b"tQ"); // TUPLE, BINPERSID
        p.int(0);
        p.int_tuple(t.shape());
        p.int_tuple(&strides(t.shape()));
        p.0.push(0x89); // NEWFALSE: requires_grad
        p.empty_ordered_dict(); // backward hooks
        p.0.extend_from_slice(b"tR"); // TUPLE, REDUCE
    }
    p.0.extend_from_slice(b"u."); // SETITEMS, STOP

    let stored = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .large_file(true);
    let mut zip = zip::ZipWriter::new(out);
    zip.start_file(format!("{root}/data.pkl"), stored)?;
    zip.write_all(&p.0)?;
    zip.start_file(format!("{root}/byteorder"), stored)?;
    zip.write_all(b"little")?;
    for (i, (_, t)) in tensors.iter().enumerate() {
        zip.start_file(format!("{root}/data/{i}"), stored.with_alignment(64))?;
        zip.write_all(&t.bytes())?;
    }
    zip.start_file(format!("{root}/version"), stored)?;
    zip.write_all(b"3\n")?;
    zip.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burn_reads_back_what_is_written() {
        let tensors = vec![
            (
                "a.weight".to_owned(),
                TorchTensor::F32 { shape: vec![2, 3], values: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.5] },
            ),
            ("a.count".to_owned(), TorchTensor::I64 { shape: vec![], values: vec![42] }),
            (
                "b".to_owned(),
                TorchTensor::F32 { shape: vec![4], values: vec![-1.0, 0.0, 1e-9, 7.0] },
            ),
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.ckpt");
        write_state_dict(std::fs::File::create(&path).unwrap(), "model_weights", &tensors).unwrap();
        let r = burn_store::pytorch::PytorchReader::new(&path).unwrap();
        assert_eq!(r.len(), 3);
        let a = r.get("a.weight").unwrap().to_data().unwrap();
        assert_eq!(a.shape.as_slice(), [2, 3]);
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.5]);
        let c = r.get("a.count").unwrap().to_data().unwrap();
        assert_eq!(c.to_vec::<i64>().unwrap(), vec![42]);
        let b = r.get("b").unwrap().to_data().unwrap();
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![-1.0, 0.0, 1e-9, 7.0]);
    }
}
