#!/usr/bin/env bash
# Runs hami-model's three suites: normal tests (proptest, std threads), loom, shuttle.
# Each suite has its own target directory (the cfgs change every crate's build), runs even if
# an earlier one failed, and prints its time; the script exits non-zero if any suite failed.
#
#   bash model/run.sh            # all three
#   bash model/run.sh loom       # one or more of: normal loom shuttle
#
# Environment: LOOM_MAX_PREEMPTIONS (default 2; a few tests raise their own bound to 3),
# SCENARIO_ITERATIONS (scales the shuttle iteration counts, 1000 = as written),
# CARGO_PROFILE_RELEASE_DEBUG (default 0 here: release builds without debuginfo build faster).
set -u
cd "$(dirname "$0")/.."

export CARGO_PROFILE_RELEASE_DEBUG="${CARGO_PROFILE_RELEASE_DEBUG:-0}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-0}"

suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=(normal loom shuttle)

failed=()
summary=()

run_suite() {
    local name=$1
    shift
    echo "=== $name: $*"
    local start=$SECONDS
    if "$@"; then
        summary+=("$name: ok in $((SECONDS - start)) s")
    else
        summary+=("$name: FAILED in $((SECONDS - start)) s")
        failed+=("$name")
    fi
}

for s in "${suites[@]}"; do
    case $s in
    normal)
        run_suite normal env -u RUSTFLAGS cargo test -p hami-model --no-fail-fast
        ;;
    loom)
        run_suite loom env RUSTFLAGS="--cfg loom" \
            cargo test -p hami-model --release --no-fail-fast --target-dir target/loom
        ;;
    shuttle)
        run_suite shuttle env RUSTFLAGS="--cfg shuttle" \
            cargo test -p hami-model --release --no-fail-fast --target-dir target/shuttle
        ;;
    *)
        echo "unknown suite: $s (normal, loom, shuttle)" >&2
        exit 2
        ;;
    esac
done

echo "=== summary"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
