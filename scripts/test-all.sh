#!/usr/bin/env bash
# Every test of the project, in order of cost. Prints one line per suite with its time.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
declare -a summary=()

suite() {
    local name=$1; shift
    local start=$SECONDS
    echo "=== $name: $*"
    "$@"
    summary+=("$(printf '%-28s %4ds' "$name" $((SECONDS - start)))")
}

suite "cargo build (release)"   cargo build --workspace --release --locked
suite "cargo test"              cargo test --workspace --locked
suite "cargo test (release)"    cargo test --workspace --release --locked
suite "c-tests"                 make -C c-tests all-tests
suite "loom + shuttle models"   bash model/run.sh
suite "TLA+ (TLC)"              bash spec/run.sh

echo "=== summary"
printf '%s\n' "${summary[@]}"
