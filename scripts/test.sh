#!/usr/bin/env bash
# The whole test suite. Cheapest checks first.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-0}"

cargo fmt --all -- --check
# --all-features also compiles the CUDA backend's code paths (no GPU needed to build them).
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
cargo test --workspace --locked

# The two readers on a corpus the writer made: same verdict, same summary.
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
cargo run --quiet --locked -p asr-examples --bin make-synthetic-corpus -- "$out/demo.asrcorpus" --utterances 500
"$CARGO_TARGET_DIR/debug/asrc" validate --json "$out/demo.asrcorpus" > "$out/rust.json"
python3 format-spec/reference/read_corpus.py "$out/demo.asrcorpus" > "$out/python.json"
python3 - "$out/rust.json" "$out/python.json" <<'PY'
import json, sys
rust = json.load(open(sys.argv[1]))
python = json.load(open(sys.argv[2]))
assert rust["valid"], rust
if rust["report"] != python:
    sys.exit(f"asrc validate and the Python reader disagree:\n{rust['report']}\n{python}")
print(f"cross-reader check: 1 passed, 0 failed ({python['utterances']} utterances agree)")
PY
