//! FLAC conformance against the reference decoder, on the IETF CELLAR FLAC decoder test bench
//! (`compiler/tests/data/flac-conformance`, see its README.txt): every file either decodes to
//! exactly the samples `flac -d` writes, or is rejected; a file `flac -d` decodes is rejected
//! only for a reason listed in `ON_PURPOSE`. Both decoders are held to it. Then a few thousand
//! mutated files (bit flips, truncations, header edits) go through both decoders: no panic, and
//! anything accepted is the original audio.

use std::path::{Path, PathBuf};
use std::process::Command;

use asr_compiler::{decode_pcm, md5_of, Decoder, Reject};
use asr_corpus::synth::SplitMix64;

fn bench_dir() -> PathBuf {
    Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("tests/data/flac-conformance")
}

/// The committed bench files, or with `FLAC_BENCH_DIR` set, every `.flac` file under that
/// directory (a checkout of the whole bench: README.txt there says how).
fn bench_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "flac") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    match std::env::var_os("FLAC_BENCH_DIR") {
        Some(dir) => walk(Path::new(&dir), &mut files),
        None => {
            walk(&bench_dir().join("valid"), &mut files);
            walk(&bench_dir().join("faulty"), &mut files);
            assert!(files.len() >= 50, "the bench files are missing: {}", files.len());
        }
    }
    files.sort();
    files
}

/// Files the reference decoder decodes and `asrc` rejects on purpose: (file name prefix,
/// reason, why). Anything else `flac -d` decodes must come out sample for sample. (The two
/// streams without STREAMINFO, u10 and f06, are not here: `flac -d` writes them with a format of
/// zeros, so it does not decode them either.)
const ON_PURPOSE: &[(&str, &str, &str)] = &[
    // STREAMINFO announces 39842 samples, the stream holds 109487; flac -d stops at the count.
    // Which part is right is not known.
    ("f05", "corrupt_flac", "more samples than the header announces"),
    // The first frame's header gives a block size of 65536, which FLAC does not allow; libFLAC
    // reports it and flac -d goes on without that frame.
    ("f08", "corrupt_flac", "an invalid frame header"),
];

/// The samples `flac -d` writes, interleaved, or None when it fails. The WAV
/// output is parsed (raw output refuses depths that are not whole bytes): samples sit in
/// containers of whole bytes, left-justified, 8-bit ones unsigned.
fn reference(path: &Path) -> Option<Vec<i32>> {
    let out = Command::new("flac")
        .args(["-d", "-c", "-s"])
        .arg(path)
        .output()
        .expect("flac is needed for this test (bash scripts/setup.sh installs it)");
    if !out.status.success() {
        return None;
    }
    let wav = out.stdout;
    assert_eq!(&wav[..4], b"RIFF", "{}", path.display());
    let (mut at, mut fmt, mut data) = (12usize, None, None);
    while at + 8 <= wav.len() {
        let id = &wav[at..at + 4];
        let len = u32::from_le_bytes(wav[at + 4..at + 8].try_into().unwrap()) as usize;
        // Written to a pipe, a stream of unknown length gets a data chunk of length 0 (or one
        // past the end): its data is the rest of the output.
        let len = if id == b"data" && (len == 0 || at + 8 + len > wav.len()) {
            wav.len() - at - 8
        } else {
            len
        };
        let body = &wav[at + 8..(at + 8 + len).min(wav.len())];
        match id {
            b"fmt " => fmt = Some(body.to_vec()),
            b"data" => data = Some(body.to_vec()),
            _ => {}
        }
        at += 8 + len + len % 2;
    }
    let (fmt, data) = (fmt.unwrap(), data.unwrap());
    let channels = u16::from_le_bytes([fmt[2], fmt[3]]) as usize;
    if channels == 0 {
        // A stream without STREAMINFO: flac writes its samples under a WAV header of zeros, not
        // knowing their format either.
        return None;
    }
    let block_align = u16::from_le_bytes([fmt[12], fmt[13]]) as usize;
    let container = block_align / channels;
    // WAVE_FORMAT_EXTENSIBLE (0xFFFE) names the valid bits; plain PCM uses the whole container.
    let tag = u16::from_le_bytes([fmt[0], fmt[1]]);
    let bits = if tag == 0xFFFE {
        u16::from_le_bytes([fmt[18], fmt[19]]) as u32
    } else {
        8 * container as u32
    };
    let shift = 8 * container as u32 - bits;
    Some(
        data.chunks_exact(container)
            .map(|c| {
                if container == 1 {
                    (i32::from(c[0]) - 128) >> shift
                } else {
                    let mut b = [0u8; 4];
                    b[4 - container..].copy_from_slice(c);
                    (i32::from_le_bytes(b) >> (8 * (4 - container))) >> shift
                }
            })
            .collect(),
    )
}

#[derive(Default, Debug)]
struct Tally {
    exact: usize,
    rejected_like_flac: usize,
    rejected_on_purpose: usize,
    rejected_valid: Vec<String>,
}

fn run_bench(decoder: Decoder) -> Tally {
    let mut tally = Tally::default();
    for path in bench_files() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let want = reference(&path);
        let got = decode_pcm(std::fs::read(&path).unwrap(), decoder);
        match (&got, &want) {
            (Ok(pcm), Some(want)) => {
                assert!(
                    pcm.samples == *want,
                    "{} kept {name} with samples that differ from flac -d's \
                     ({} samples against {})",
                    decoder.name(),
                    pcm.samples.len(),
                    want.len()
                );
                tally.exact += 1;
            }
            (Ok(pcm), None) => panic!(
                "{} kept {name} ({} samples), which the reference decoder refuses",
                decoder.name(),
                pcm.samples.len()
            ),
            (Err(_), None) => tally.rejected_like_flac += 1,
            (Err(r), Some(_)) => {
                let listed = ON_PURPOSE
                    .iter()
                    .find(|(prefix, _, _)| name.starts_with(prefix))
                    .map(|(_, reason, _)| *reason);
                if listed == Some(r.reason().name()) {
                    tally.rejected_on_purpose += 1;
                } else {
                    tally.rejected_valid.push(format!("{name}: {} ({})", r.reason(), r.detail()));
                }
            }
        }
        eprintln!(
            "{:>9} {name:<34} {}",
            decoder.name(),
            match &got {
                Ok(p) => format!("ok: {} Hz, {} ch, {} bit", p.rate, p.channels, p.bits),
                Err(r) => format!("{}: {}", r.reason(), r.detail()),
            }
        );
    }
    eprintln!("{}: {tally:?}", decoder.name());
    tally
}

#[test]
fn libflac_decodes_every_valid_file_exactly_or_rejects_it_on_purpose() {
    let tally = run_bench(Decoder::Libflac);
    if std::env::var_os("FLAC_BENCH_DIR").is_none() {
        assert!(
            tally.rejected_valid.is_empty(),
            "valid files rejected: {:#?}",
            tally.rejected_valid
        );
        assert!(tally.exact >= 40, "{tally:?}");
    }
}

#[test]
fn symphonia_never_keeps_wrong_samples() {
    // symphonia rejects some valid files (32-bit, some old encoders' streams): that is data,
    // reported; what it keeps must be exact (run_bench asserts it).
    let tally = run_bench(Decoder::Symphonia);
    if std::env::var_os("FLAC_BENCH_DIR").is_none() {
        assert!(tally.exact >= 30, "{tally:?}");
    }
}

#[test]
fn format_changes_mid_stream_are_rejected_with_their_reason() {
    for (file, what) in [
        ("u02-ch-increase.cut.flac", "channel count"),
        ("u03-ch-decrease.cut.flac", "channel count"),
        ("u04-bps-change.cut.flac", "bit depth"),
    ] {
        let bytes = std::fs::read(bench_dir().join("valid").join(file)).unwrap();
        match decode_pcm(bytes.clone(), Decoder::Libflac) {
            Err(Reject::FormatChange(d)) => assert!(d.contains(what), "{file}: {d}"),
            Err(r) => panic!("libflac on {file}: {r:?}"),
            Ok(p) => panic!("libflac kept {file}: {} samples", p.samples.len()),
        }
        // symphonia stops quietly at the first frame of the new format; these streams record
        // neither length nor MD5, so its part cannot be checked and is not kept.
        match decode_pcm(bytes, Decoder::Symphonia) {
            Err(r) => assert!(
                matches!(r, Reject::FormatChange(_) | Reject::Unsupported(_)),
                "symphonia on {file}: {r:?}"
            ),
            Ok(p) => panic!("symphonia kept {file}: {} samples", p.samples.len()),
        }
    }
}

#[test]
fn many_channels_downmix_to_the_mean_and_32_bit_keeps_its_depth() {
    let eight = decode_pcm(
        std::fs::read(bench_dir().join("valid/s43-8ch.cut.flac")).unwrap(),
        Decoder::Libflac,
    )
    .unwrap();
    assert_eq!(eight.channels, 8);
    let mono = asr_compiler::downmix(&eight);
    let scale = f64::from(1u32 << (eight.bits - 1));
    for (k, frame) in eight.samples.chunks_exact(8).enumerate() {
        let mean = frame.iter().map(|&v| f64::from(v)).sum::<f64>() / 8.0 / scale;
        assert!((f64::from(mono[k]) - mean).abs() < 1e-7, "frame {k}");
    }
    let wide = decode_pcm(
        std::fs::read(bench_dir().join("valid/u05-32bit.cut.flac")).unwrap(),
        Decoder::Libflac,
    )
    .unwrap();
    assert_eq!(wide.bits, 32);
    assert!(wide.md5_checked);
    assert!(wide.samples.iter().any(|&v| v.unsigned_abs() > 1 << 24), "uses the full depth");
}

/// One mutation of `good`: bit flips anywhere, a truncation, or an edit of the header bytes.
fn mutate(good: &[u8], rng: &mut SplitMix64) -> Vec<u8> {
    let mut b = good.to_vec();
    let pick = |rng: &mut SplitMix64, n: usize| (rng.next_u64() % n as u64) as usize;
    match rng.next_u64() % 3 {
        0 => {
            for _ in 0..1 + pick(rng, 8) {
                let i = pick(rng, b.len());
                b[i] ^= 1 << pick(rng, 8);
            }
        }
        1 => b.truncate(pick(rng, b.len())),
        _ => {
            let end = b.len().min(64);
            for _ in 0..1 + pick(rng, 4) {
                let i = pick(rng, end);
                b[i] = rng.next_u64() as u8;
            }
        }
    }
    b
}

#[test]
fn mutated_files_never_panic_and_never_decode_to_other_audio() {
    let mut rng = SplitMix64::new(15);
    let sources =
        ["valid/s60-mono.flac", "valid/s38-3ch.cut.flac", "valid/s24-varbs-flake.cut.flac"];
    let (mut accepted, mut rejected) = (0usize, 0usize);
    for source in sources {
        let good = std::fs::read(bench_dir().join(source)).unwrap();
        let originals: Vec<[u8; 16]> = [Decoder::Libflac, Decoder::Symphonia]
            .iter()
            .map(|&d| md5_of(&decode_pcm(good.clone(), d).unwrap()))
            .collect();
        for i in 0..1000 {
            let bad = mutate(&good, &mut rng);
            for (k, decoder) in [Decoder::Libflac, Decoder::Symphonia].into_iter().enumerate() {
                match decode_pcm(bad.clone(), decoder) {
                    Ok(pcm) => {
                        accepted += 1;
                        assert_eq!(
                            md5_of(&pcm),
                            originals[k],
                            "{source} mutation {i}: {} kept different audio",
                            decoder.name()
                        );
                    }
                    Err(_) => rejected += 1,
                }
            }
        }
    }
    eprintln!("mutations: {accepted} decoded to the original audio, {rejected} rejected");
    assert!(rejected > 1000, "the mutations should break most files");
}

#[test]
fn a_wrong_md5_rejects_the_file_unless_the_check_is_off() {
    use asr_compiler::decode_pcm_with;
    let mut bytes = std::fs::read(bench_dir().join("valid/s60-mono.flac")).unwrap();
    // STREAMINFO's MD5 is bytes 26..42 of the file ("fLaC", block header, 18 bytes before it).
    bytes[30] ^= 0x01;
    for decoder in [Decoder::Libflac, Decoder::Symphonia] {
        match decode_pcm_with(bytes.clone(), decoder, true) {
            Err(Reject::CorruptFlac(d)) => assert!(d.contains("MD5"), "{}: {d}", decoder.name()),
            Err(r) => panic!("{}: {r:?}", decoder.name()),
            Ok(_) => panic!("{} kept a file whose samples do not match its MD5", decoder.name()),
        }
        let pcm = decode_pcm_with(bytes.clone(), decoder, false).unwrap();
        assert!(!pcm.md5_checked);
    }
}

#[test]
fn asrc_probe_reports_the_md5_metaflac_reads_and_the_reject_reason() {
    let files = ["valid/s43-8ch.cut.flac", "valid/u05-32bit.cut.flac", "valid/s62-overflow20.flac"];
    let paths: Vec<String> =
        files.iter().map(|f| bench_dir().join(f).display().to_string()).collect();
    let mut args = vec!["probe", "--md5", "--json"];
    args.extend(paths.iter().map(String::as_str));
    let o = crate::asrc(&args);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), files.len());
    for (line, path) in lines.iter().zip(&paths) {
        let meta = Command::new("metaflac").args(["--show-md5sum", path]).output().unwrap();
        let recorded = String::from_utf8(meta.stdout).unwrap().trim().to_owned();
        assert_eq!(line["md5"], recorded.as_str(), "{path}");
        assert_eq!(line["kept"], true);
        assert_eq!(line["md5_checked"], true);
    }
    let bad = bench_dir().join("valid/u02-ch-increase.cut.flac").display().to_string();
    let o = crate::asrc(&["probe", &paths[0], &bad]);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("rejected, format_change: the channel count changes"), "{text}");
}
