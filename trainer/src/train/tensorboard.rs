//! TensorBoard event files, written directly: TFRecord framing (length, masked CRC-32C of the
//! length, payload, masked CRC-32C of the payload) around `Event` protocol buffers holding
//! scalar summaries. TensorBoard (and `wandb sync --sync-tensorboard`) read them; nothing
//! else is needed, so no crate (and no protobuf compiler) is.
//!
//! The protobuf fields written (tensorflow/core/util/event.proto, summary.proto):
//! `Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary =
//! 5; }`, `Summary { repeated Value value = 1; }`, `Value { string tag = 1; float
//! simple_value = 2; }`.

use std::io::Write;
use std::path::Path;

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses it.
pub fn crc32c(bytes: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
            }
            *e = c;
        }
        t
    });
    !bytes.iter().fold(!0u32, |c, &b| (c >> 8) ^ table[((c as u8) ^ b) as usize])
}

/// TFRecord's masked CRC: rotated right by 15 bits, plus a constant.
fn masked(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord around `payload`.
pub fn record(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(payload.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked(crc32c(&len)).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&masked(crc32c(payload)).to_le_bytes());
    out
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field: `field` number, wire type 2.
fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// An `Event` with its wall time and step, and either a file version or scalar values.
fn event(
    wall_time: f64,
    step: i64,
    file_version: Option<&str>,
    scalars: &[(&str, f32)],
) -> Vec<u8> {
    let mut e = Vec::new();
    varint(&mut e, 1 << 3 | 1);
    e.extend_from_slice(&wall_time.to_le_bytes());
    varint(&mut e, 2 << 3);
    // int64 is encoded as its two's complement in a varint.
    varint(&mut e, step as u64);
    if let Some(v) = file_version {
        bytes_field(&mut e, 3, v.as_bytes());
    }
    if !scalars.is_empty() {
        let mut summary = Vec::new();
        for (tag, value) in scalars {
            let mut v = Vec::new();
            bytes_field(&mut v, 1, tag.as_bytes());
            varint(&mut v, 2 << 3 | 5);
            v.extend_from_slice(&value.to_le_bytes());
            bytes_field(&mut summary, 1, &v);
        }
        bytes_field(&mut e, 5, &summary);
    }
    e
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// An open event file: `DIR/events.out.tfevents.<seconds>.<host>.<pid>.<n>` (TensorBoard finds
/// files by the `tfevents` in their name and reads them in name order; a resumed run adds a
/// file, as TensorBoard expects; `n` counts the files this process made, so that a run and its
/// resume in one second of one process do not share a name).
#[derive(Debug)]
pub struct EventWriter {
    file: std::fs::File,
}

impl EventWriter {
    /// Creates a new event file in `dir`, starting with the file-version event.
    pub fn create(dir: &Path) -> std::io::Result<EventWriter> {
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        static FILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = now();
        // Zero-padded, so that name order is creation order within a process.
        let name = format!("events.out.tfevents.{}.{host}.{}.{n:06}", t as u64, std::process::id());
        // Never over another run's events.
        let mut file =
            std::fs::File::options().write(true).create_new(true).open(dir.join(name))?;
        file.write_all(&record(&event(t, 0, Some("brain.Event:2"), &[])))?;
        file.flush()?;
        Ok(EventWriter { file })
    }

    /// Appends `scalars` at `step` (one event) and flushes, so TensorBoard sees them at once.
    pub fn scalars(&mut self, step: u64, scalars: &[(&str, f32)]) -> std::io::Result<()> {
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        self.file.write_all(&record(&event(now(), step, None, scalars)))?;
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_its_check_value() {
        // The catalogue check value of CRC-32C (iSCSI): "123456789" -> 0xE3069283.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn varints_are_little_endian_base_128() {
        let mut v = Vec::new();
        varint(&mut v, 300);
        assert_eq!(v, [0xAC, 0x02]);
        let mut v = Vec::new();
        varint(&mut v, u64::MAX);
        assert_eq!(v.len(), 10);
    }
}
