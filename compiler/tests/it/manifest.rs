//! Manifest reading: rows, nulls, string layouts, chunking, audio paths, schema errors naming the
//! column. Manifests are generated here from Rust tables.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float32Array, Float64Array, Int64Array, LargeStringArray, RecordBatch, StringArray,
};
use arrow::datatypes::{Field, Schema};
use asr_compiler::{ManifestError, ManifestReader, ManifestRow};
use parquet::arrow::ArrowWriter;

pub fn write(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(schema.clone(), columns.into_iter().map(|(_, a)| a).collect())
        .unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn standard(n: usize) -> Vec<(&'static str, ArrayRef)> {
    let ids: Vec<String> = (0..n).map(|i| format!("seg-{i}")).collect();
    let col = |f: &dyn Fn(usize) -> Option<String>| -> ArrayRef {
        Arc::new(StringArray::from((0..n).map(f).collect::<Vec<_>>()))
    };
    vec![
        ("segment_id", col(&|i| Some(ids[i].clone()))),
        ("shard_id", col(&|i| Some(format!("sh{}", i % 3)))),
        ("text", col(&|i| if i == 2 { None } else { Some(format!("<|hi|> वाक्य {i}")) })),
        (
            "duration",
            Arc::new(Float64Array::from((0..n).map(|i| Some(1.0 + i as f64)).collect::<Vec<_>>())),
        ),
        ("lang", col(&|_| Some("hi".into()))),
        ("tar_member_name", col(&|i| Some(format!("seg-{i}.flac")))),
        ("tar_path", col(&|i| Some(format!("shards/sh{}/audio.tar", i % 3)))),
        ("source", col(&|_| Some("read".into()))),
    ]
}

fn read_all(path: &Path, batch: usize) -> Vec<ManifestRow> {
    let mut r = ManifestReader::open(path, batch).unwrap();
    let mut rows = Vec::new();
    while let Some(chunk) = r.next_chunk() {
        let chunk = chunk.unwrap();
        assert!(chunk.len() <= batch);
        rows.extend(chunk);
    }
    rows
}

#[test]
fn rows_stream_in_chunks_with_nulls_kept_as_none() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.parquet");
    write(&path, standard(25));
    let rows = read_all(&path, 7);
    assert_eq!(rows.len(), 25);
    assert_eq!(ManifestReader::open(&path, 7).unwrap().rows, 25);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.row, i as u64);
        assert_eq!(r.segment_id.as_deref(), Some(format!("seg-{i}").as_str()));
        assert_eq!(r.duration, Some(1.0 + i as f64));
    }
    assert_eq!(rows[2].text, None);
    assert_eq!(rows[3].text.as_deref(), Some("<|hi|> वाक्य 3"));
    // dirname(tar_path)/tar_member_name, relative to the base directory.
    assert_eq!(
        rows[4].audio_path(Path::new("/data")).unwrap(),
        Path::new("/data/shards/sh1/seg-4.flac")
    );
    let abs = ManifestRow {
        tar_path: Some("/abs/sh/a.tar".into()),
        tar_member_name: Some("x.flac".into()),
        ..ManifestRow::default()
    };
    assert_eq!(abs.audio_path(Path::new("/data")).unwrap(), Path::new("/abs/sh/x.flac"));
    assert_eq!(ManifestRow::default().audio_path(Path::new("/data")), None);
}

#[test]
fn other_string_layouts_and_float32_durations_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.parquet");
    let mut cols = standard(4);
    cols[0].1 = Arc::new(LargeStringArray::from(vec!["a", "b", "c", "d"]));
    cols[3].1 = Arc::new(Float32Array::from(vec![0.5f32, 1.5, 2.5, 3.5]));
    write(&path, cols);
    let rows = read_all(&path, 100);
    assert_eq!(rows[1].segment_id.as_deref(), Some("b"));
    assert_eq!(rows[3].duration, Some(3.5));
}

#[test]
fn schema_problems_name_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.parquet");
    let mut cols = standard(3);
    cols.retain(|(n, _)| *n != "lang");
    write(&path, cols);
    let e = ManifestReader::open(&path, 10).unwrap_err();
    assert!(matches!(e, ManifestError::MissingColumn { column: "lang", .. }), "{e}");
    assert!(e.to_string().contains("missing column `lang`"), "{e}");

    let mut cols = standard(3);
    cols[3].1 = Arc::new(Int64Array::from(vec![1, 2, 3]));
    write(&path, cols);
    let e = ManifestReader::open(&path, 10).unwrap_err().to_string();
    assert!(e.contains("column `duration` has type Int64, expected a float"), "{e}");

    let mut cols = standard(3);
    cols[1].1 = Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0]));
    write(&path, cols);
    let e = ManifestReader::open(&path, 10).unwrap_err().to_string();
    assert!(e.contains("column `shard_id` has type Float64, expected a string"), "{e}");

    std::fs::write(&path, b"not parquet at all").unwrap();
    assert!(matches!(ManifestReader::open(&path, 10).unwrap_err(), ManifestError::Parquet { .. }));
    assert!(matches!(
        ManifestReader::open(&dir.path().join("none.parquet"), 10).unwrap_err(),
        ManifestError::Io { .. }
    ));
}
