#!/usr/bin/env bash
# Symbol hygiene: the dynamic symbols libvgpu.so defines must be exactly the intended list.
#
#   check_symbols.sh <libvgpu.so> <expected-list-file>...
#
# Takes the names of the defined dynamic symbols of types T (code), W (weak) and D/B (data) from
# `nm -D --defined-only`, and compares them with the union of the expected lists (one name per
# line; blank lines and lines starting with # are ignored). Prints what is missing and what is
# unexpected; exit status 0 only if both are empty.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 <libvgpu.so> <expected-list-file>..." >&2
    exit 2
fi
lib=$1
shift
[ -f "$lib" ] || { echo "FAIL symbols: no library at $lib" >&2; exit 2; }
command -v nm >/dev/null || { echo "FAIL symbols: nm not found (binutils)" >&2; exit 2; }
export LC_ALL=C
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# nm -D prints "ADDRESS TYPE NAME[@VERSION]"; drop version suffixes.
nm -D --defined-only "$lib" | awk '$2 ~ /^[TWDB]$/ { sub(/@.*/, "", $3); print $3 }' | sort -u >"$tmp/actual"
cat "$@" | sed -e 's/#.*//' -e 's/[[:space:]]//g' | grep -v '^$' | sort -u >"$tmp/expected"
missing=$(comm -23 "$tmp/expected" "$tmp/actual")
extra=$(comm -13 "$tmp/expected" "$tmp/actual")
[ -z "$missing" ] || { echo "missing from $lib:"; printf '  %s\n' $missing; }
[ -z "$extra" ] || { echo "exported but not in the list:"; printf '  %s\n' $extra; }
if [ -z "$missing" ] && [ -z "$extra" ]; then
    echo "PASS symbols: $(wc -l <"$tmp/actual") exported, exactly the $(wc -l <"$tmp/expected") listed"
    exit 0
fi
echo "FAIL symbols: $(echo "$missing" | grep -c . || true) missing, $(echo "$extra" | grep -c . || true) unexpected"
exit 1
