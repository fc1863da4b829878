#!/usr/bin/env bash
# c-tests/gpu/sm_limit.sh [LIBVGPU]: does CUDA_DEVICE_SM_LIMIT hold on a real GPU, for every kind
# of work and every number of processes? (issue 19: within +-3 points of 25, 50 and 75)
#
#   HK_RESULTS=results.txt bash c-tests/gpu/sm_limit.sh target/release/libvgpu.so
#
# One matrix of rows, run one after another (never two rows on the GPU at once). A row is
# WORK/Pp/LIMIT: P processes (1, 2 or 4) of c-tests/gpu/sm_work.py --work WORK, started together
# and sharing one region file (one container, one limit), under LD_PRELOAD=LIBVGPU (default
# target/release/libvgpu.so) with GPU_CORE_UTILIZATION_POLICY=force and CUDA_DEVICE_SM_LIMIT=
# LIMIT; LIMIT "none" is the library without a limit (CUDA_DEVICE_SM_LIMIT=100), the reference of
# the rows with the same WORK and P; "plain" runs without LD_PRELOAD (the plain driver: the
# library's own cost). WORK: matmul (8192^3 bf16 products, compute-bound), small (20 elementwise
# kernels on 1 M floats per step, launch-bound), graph (replays of a CUDA graph of twenty 4096^3
# products), mix (per step one replay of a ten-product graph, then 20 small kernels), bursts
# (0.6 s of matmul's products, then 1.2 s idle, over and over: a server between requests; run
# its rows with SM_WARMUP=10 SM_MEASURE=6: the start's second measurement comes with the 4th or
# 5th burst, and the window should hold whole bursts).
# Each row gets a fresh region file (CUDA_DEVICE_MEMORY_SHARED_CACHE in its own folder); its
# processes import torch, set up on the GPU, report ready, and start together at one time: they
# work SM_WARMUP seconds (default 4: the limiter measures the program unthrottled for its first
# 1.2-3 s, until its rate stops rising, and for 0.4 s 2 s later only where the start is in doubt:
# work in bursts, or a program that idled; neither is paid back), then count
# their work over SM_MEASURE seconds (default 5: the settled window), exactly (synchronised
# before each clock read), and report their rate in 1-second bins over the whole run as well.
#
# Default rows (29, about 6 minutes on an H200): matmul/1p/plain; matmul, small, graph, mix and
# bursts with 1 process at none, 25, 50, 75; matmul with 2 and 4 processes at none, 25, 50, 75.
# SM_ONLY=REGEX instead runs the rows of the full matrix (every WORK with 1, 2 and 4 processes,
# and matmul/1p/plain) whose name matches (bash =~), plus the reference ("none") row of each
# limited row chosen: e.g. SM_ONLY='^small/[24]p/' (the small-kernel rows with 2 and 4 processes,
# about 95 s more), SM_ONLY='^graph/' or SM_ONLY=. (all 61 rows). Each row costs about
# SM_WARMUP + SM_MEASURE + 3.5 s (start-up on the GPU and exit) plus the torch import, which
# SM_PIPELINE=1 overlaps with the row before (off by default: the small-kernel rows are
# launch-bound, and the import beside them moved their unlimited rate between 82k and 137k
# kernels/s on the H200, docs/gpu-results.md run 15).
#
# Table: workload, processes, target, the measured rate as % of the unlimited rate of the same
# workload and processes, the band (target +-3) and verdict, the absolute rates (summed over the
# processes) and unit, "settle" (the second from which every 1-s bin of the summed rate stays
# within +-3 points of the target; "never" if the last bin is outside) and "maxdev" (the largest
# distance of a bin of the measured window from the target, in points). Then each row's bins as
# % of the unlimited rate. HK_RESULTS=FILE appends both to FILE. SM_TRACE=DIR sets
# LIBCUDA_LOG_LEVEL=4 and keeps every process's log in DIR (e.g. matmul_4p_25.3.log: its result
# line, its bins line and the library's lines, the controller's steps among them). SM_MEMORY_LIMIT sets CUDA_DEVICE_MEMORY_LIMIT (default
# unset). Exit status 1 if any limited row is outside its band or any row gave no result; the
# full table is printed either way. Changes no GPU setting. Needs python3 with torch.
# SM_REF_AFTER=1 runs each chosen reference again after its limited rows (row WORK/Pp/again) and
# takes the mean of the two as the reference, printing both: a launch-bound program's unlimited
# rate is the CPU's, and moves between rows. SM_CPUS=LIST runs every process under taskset -c
# LIST (e.g. 2-5), so that rows do not differ in the cores they get. SM_CLOCKS=1 samples the
# GPU's SM clock (nvidia-smi, about 4 times a second) while the rows run and prints its mean in
# each 1-s bin of each row: a launch-bound row's rate moves with the host's speed and with the
# GPU's clock, and only the second shows there (run 26's small/1p rows).
# c-tests/gpu/sm_dry.sh runs this script without a GPU (a stand-in torch and nvidia-smi).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
vgpu=${1:-$root/target/release/libvgpu.so}
case $vgpu in /*) ;; *) vgpu=$PWD/$vgpu ;; esac
[ -f "$vgpu" ] || { echo "no $vgpu"; exit 1; }
warmup=${SM_WARMUP:-4}
measure=${SM_MEASURE:-5}
trace=${SM_TRACE:-}
pipeline=${SM_PIPELINE:-0}
ref_after=${SM_REF_AFTER:-0}
clocks=${SM_CLOCKS:-0}
declare -a pin=()
[ -n "${SM_CPUS:-}" ] && pin=(taskset -c "$SM_CPUS")
py="$here/sm_work.py"
# a worker may wait for a whole row before its own starts: its timeout covers both
tmo=$(awk -v w="$warmup" -v m="$measure" 'BEGIN { printf "%d", 2 * (w + m) + 240 }')
work=$(mktemp -d /tmp/hami-sm.XXXXXX)
declare -a cur=() next=()
sampler=
cleanup() {
    local pid
    for pid in "${cur[@]}" "${next[@]}" $sampler; do kill "$pid" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT

# ---- the rows ----------------------------------------------------------------------------------
declare -a all=(matmul/1p/plain)
for w in matmul small graph mix bursts; do
    for p in 1 2 4; do
        for l in none 25 50 75 again; do all+=("$w/${p}p/$l"); done
    done
done
re=${SM_ONLY:-'^(matmul/1p/plain|[a-z]+/1p/.*|matmul/[24]p/.*)$'}
declare -A chosen=()
for r in "${all[@]}"; do
    [[ $r == */again ]] && continue
    if [[ $r =~ $re ]]; then
        chosen[$r]=1
        case $r in */plain | */none) ;; *)
            chosen[${r%/*}/none]=1
            [ "$ref_after" = 1 ] && chosen[${r%/*}/again]=1
            ;;
        esac
    fi
done
declare -a rows=()
for r in "${all[@]}"; do [ -n "${chosen[$r]:-}" ] && rows+=("$r"); done
[ ${#rows[@]} -gt 0 ] || { echo "SM_ONLY=$re matches no row"; exit 1; }

# spawn ROW: starts ROW's processes; they import torch and wait for ROW's folder's "init" file
# before touching the GPU. Their pids go to the array `next`.
spawn() {
    local row=$1 w p l procs dir i lim
    IFS=/ read -r w p l <<<"$row"
    procs=${p%p}
    dir=$work/${row//\//_}
    mkdir -p "$dir"
    next=()
    for i in $(seq 1 "$procs"); do
        if [ "$l" = plain ]; then
            "${pin[@]}" timeout -k 5 "$tmo" python3 "$py" "$dir" "$warmup" "$measure" --work "$w" --bins \
                >"$dir/$i.log" 2>&1 &
        else
            lim=$l
            case $l in none | again) lim=100 ;; esac
            env LD_PRELOAD="$vgpu" CUDA_DEVICE_MEMORY_SHARED_CACHE="$dir/region.cache" \
                GPU_CORE_UTILIZATION_POLICY=force CUDA_DEVICE_SM_LIMIT="$lim" \
                ${trace:+LIBCUDA_LOG_LEVEL=4} ${SM_MEMORY_LIMIT:+CUDA_DEVICE_MEMORY_LIMIT=$SM_MEMORY_LIMIT} \
                "${pin[@]}" timeout -k 5 "$tmo" python3 "$py" "$dir" "$warmup" "$measure" --work "$w" --bins \
                >"$dir/$i.log" 2>&1 &
        fi
        next+=($!)
    done
}

# start DIR PROCS: lets the processes of `cur` set up, waits until all PROCS are ready (or one
# has died, or 120 s), then gives them one start time 0.5 s ahead.
start() {
    local dir=$1 procs=$2 n alive pid t_end=$((SECONDS + 120))
    : >"$dir/init"
    while :; do
        n=$(compgen -G "$dir/ready.*" | wc -l)
        [ "$n" -ge "$procs" ] && break
        alive=0
        for pid in "${cur[@]}"; do kill -0 "$pid" 2>/dev/null && alive=$((alive + 1)); done
        [ "$alive" -lt "$procs" ] && { echo "--- $dir: a process ended before it was ready" >&2; break; }
        [ "$SECONDS" -ge "$t_end" ] && { echo "--- $dir: $n of $procs ready after 120 s" >&2; break; }
        sleep 0.05
    done
    awk -v t="$(date +%s.%N)" 'BEGIN { printf "%.3f\n", t + 0.5 }' >"$dir/start.tmp"
    mv "$dir/start.tmp" "$dir/start"
}

# collect ROW: sums its processes' rates and bins into rate[ROW], bins[ROW], unit[ROW], and
# with SM_CLOCKS=1 the mean SM clock of each bin into clock[ROW].
declare -A rate=() bins=() unit=() clock=()
collect() {
    local row=$1 dir=$work/${1//\//_} f v u b
    local sum=0 ok=1
    local -a lists=()
    for f in "$dir"/*.log; do
        v=$(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^rate=/) { sub(/^rate=/, "", $i); print $i } }' "$f" | tail -1)
        u=$(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^unit=/) { sub(/^unit=/, "", $i); print $i } }' "$f" | tail -1)
        b=$(sed -n 's/^bins=//p' "$f" | tail -1)
        if [ -z "$v" ] || [ -z "$b" ]; then
            echo "--- $row: ${f##*/} produced no result:" >&2
            tail -5 "$f" >&2
            ok=0
            continue
        fi
        grep -q ' late=' "$f" && echo "--- $row: ${f##*/} started late: $(grep -o 'late=[0-9.]*' "$f")" >&2
        sum=$(awk -v a="$sum" -v b="$v" 'BEGIN { printf "%.6f", a + b }')
        unit[$row]=$u
        lists+=("$b")
    done
    grep -h 'HAMI-core' "$dir"/*.log | grep -v 'sm-limit\|Debug\|Info' | sort | uniq -c | head -5 |
        sed "s|^|--- $row: |" >&2
    if [ -n "$trace" ]; then
        mkdir -p "$trace"
        for f in "$dir"/*.log; do cp "$f" "$trace/${row//\//_}.${f##*/}"; done
    fi
    [ "$ok" = 1 ] || return 0
    rate[$row]=$sum
    bins[$row]=$(printf '%s\n' "${lists[@]}" | awk -F, '
        { for (i = 1; i <= NF; i++) s[i] += $i; if (NF > n) n = NF }
        END { for (i = 1; i <= n; i++) printf "%s%.3f", (i > 1 ? "," : ""), s[i]; print "" }')
    [ "$clocks" = 1 ] || return 0
    # samples "EPOCH MHZ"; a bin without a sample reads "-"
    clock[$row]=$(awk -v s="$(cat "$dir/start")" -v n="$(awk -F, '{ print NF }' <<<"${bins[$row]}")" '
        $2 ~ /^[0-9]+$/ { i = int($1 - s); if ($1 >= s && i < n) { sum[i] += $2; cnt[i]++ } }
        END { for (i = 0; i < n; i++) printf "%s%s", (i ? " " : ""), (cnt[i] ? int(sum[i] / cnt[i] + 0.5) : "-"); print "" }' \
        "$work/clocks.txt")
}

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
echo "$gpu; ${#rows[@]} rows, about $(awk -v n=${#rows[@]} -v w="$warmup" -v m="$measure" 'BEGIN { printf "%d", n * (w + m + 3.5) }') s"
t_begin=$SECONDS
if [ "$clocks" = 1 ]; then
    # One nvidia-smi for the whole run (starting one per sample would load the host that a
    # launch-bound row is measured on), its lines stamped as they come (line-buffered).
    stdbuf -oL nvidia-smi -i 0 --query-gpu=clocks.sm --format=csv,noheader,nounits -lms 250 2>/dev/null |
        { LC_NUMERIC=C; while read -r mhz; do printf '%s %s\n' "$EPOCHREALTIME" "$mhz"; done; } >"$work/clocks.txt" &
    sampler=$!
fi
spawn "${rows[0]}"
for idx in "${!rows[@]}"; do
    row=${rows[$idx]}
    cur=("${next[@]}")
    next=()
    [ "$pipeline" = 1 ] || [ "$idx" = 0 ] || { spawn "$row"; cur=("${next[@]}"); next=(); }
    procs=${row#*/}
    procs=${procs%%p/*}
    start "$work/${row//\//_}" "$procs"
    if [ "$pipeline" = 1 ] && [ $((idx + 1)) -lt ${#rows[@]} ]; then
        spawn "${rows[$((idx + 1))]}"  # imports torch while this row runs; touches no GPU yet
    fi
    wait "${cur[@]}"
    cur=()
    collect "$row"
    printf "%s: %s %s (%d s)\n" "$row" "${rate[$row]:-no result}" "${unit[$row]:-}" $((SECONDS - t_begin))
done

# ---- the table ---------------------------------------------------------------------------------
# stats BINS REF TARGET: "SETTLE MAXDEV P1 P2 ..." (the bins as % of REF)
stats() {
    awk -v b="$1" -v r="$2" -v t="$3" -v w="$warmup" 'BEGIN {
        n = split(b, v, ",")
        if (r <= 0 || n == 0) { print "- -"; exit }
        for (i = n; i >= 1; i--) { p = 100 * v[i] / r; if (p < t - 3 || p > t + 3) break }
        settle = (i == n) ? "never" : i "s"
        c = int(w); if (c < w) c++
        md = 0
        for (j = c + 1; j <= n; j++) { d = 100 * v[j] / r - t; if (d < 0) d = -d; if (d > md) md = d }
        printf "%s %.1f", settle, md
        for (j = 1; j <= n; j++) printf " %.0f", 100 * v[j] / r
        print ""
    }'
}
# reference W/Pp: the unlimited rate of the group, the mean of its rows before and after the
# limited ones where both ran.
reference() {
    local before=${rate[$1/none]:-} after=${rate[$1/again]:-}
    if [ -n "$before" ] && [ -n "$after" ]; then
        awk -v a="$before" -v b="$after" 'BEGIN { printf "%.6f", (a + b) / 2 }'
    else
        echo "$before"
    fi
}
declare -a table=() binlines=() clocklines=() drift=()
for row in "${rows[@]}"; do
    [[ $row == */again ]] || continue
    g=${row%/*}
    [ -n "${rate[$g/none]:-}" ] && [ -n "${rate[$row]:-}" ] || continue
    drift+=("$(awk -v g="$g" -v a="${rate[$g/none]}" -v b="${rate[$row]}" -v u="${unit[$row]}" \
        'BEGIN { printf "%s: unlimited %.1f %s before the limited rows, %.1f after (%+.1f%%)", g, a, u, b, 100 * (b - a) / a }')")
done
fails=0
late_settle=0
for row in "${rows[@]}"; do
    IFS=/ read -r w p l <<<"$row"
    procs=${p%p}
    got=${rate[$row]:-}
    case $l in
    plain | none | again) ref=$got ; target=100 ;;
    *) ref=$(reference "${row%/*}") ; target=$l ;;
    esac
    if [ -z "$got" ] || [ -z "$ref" ]; then
        fails=$((fails + 1))
        table+=("$(printf '%-8s %5s %-6s %8s %-7s %-7s %10s %10s %-10s %-6s %s' "$w" "$procs" "$l" - - ERR \
            "${got:--}" "${ref:--}" "${unit[$row]:-}" - -)")
        continue
    fi
    read -r settle maxdev pcts <<<"$(stats "${bins[$row]}" "$ref" "$target")"
    binlines+=("$(printf '%-16s %s' "$row" "$pcts")")
    [ "$clocks" = 1 ] && clocklines+=("$(printf '%-16s %s' "$row" "${clock[$row]}")")
    pct=$(awk -v g="$got" -v b="$ref" 'BEGIN { printf "%.1f", (b > 0 ? 100 * g / b : -1) }')
    band=- verdict=ref
    if [ "$l" = plain ]; then
        verdict=-
        unl=${rate[matmul/1p/none]:-}
        [ -n "$unl" ] && pct=$(awk -v g="$got" -v b="$unl" 'BEGIN { printf "%.1f", 100 * g / b }') && ref=$unl
    elif [ "$l" != none ] && [ "$l" != again ]; then
        band="$((l - 3))..$((l + 3))"
        verdict=$(awk -v p="$pct" -v l="$l" 'BEGIN { print (p >= l - 3 && p <= l + 3) ? "PASS" : "FAIL" }')
        [ "$verdict" = PASS ] || fails=$((fails + 1))
        case $settle in [012]s) ;; *) late_settle=$((late_settle + 1)) ;; esac
    fi
    table+=("$(printf '%-8s %5s %-6s %7s%% %-7s %-7s %10.1f %10.1f %-10s %-6s %s' "$w" "$procs" "$l" "$pct" "$band" \
        "$verdict" "$got" "$ref" "${unit[$row]}" "$settle" "$maxdev")")
done
{
    echo "SM limit by workload and processes, $gpu, $(date -u +%Y-%m-%dT%H:%MZ), warm-up $warmup s, measured $measure s, $((SECONDS - t_begin)) s in all"
    if [ -n "${rate[matmul/1p/plain]:-}" ] && [ -n "${rate[matmul/1p/none]:-}" ]; then
        awk -v a="${rate[matmul/1p/none]}" -v b="${rate[matmul/1p/plain]}" \
            'BEGIN { printf "libvgpu.so without a limit, matmul, 1 process: %.1f%% of the plain driver\n", 100 * a / b }'
    fi
    printf '%-8s %5s %-6s %8s %-7s %-7s %10s %10s %-10s %-6s %s\n' workload procs target "of unl." band verdict \
        rate unlimited unit settle maxdev
    printf '%s\n' "${table[@]}"
    [ ${#drift[@]} -eq 0 ] || printf '%s\n' "${drift[@]}"
    echo "1-s bins of the summed rate, % of the unlimited rate (none, again, plain: of their own rate):"
    printf '%s\n' "${binlines[@]}"
    if [ "$clocks" = 1 ]; then
        echo "SM clock (MHz), mean of the samples in each 1-s bin:"
        printf '%s\n' "${clocklines[@]}"
    fi
    echo "$fails rows outside the band or without a result; $late_settle limited rows not settled within 2 s"
} | tee -a "${HK_RESULTS:-/dev/null}"
[ "$fails" -eq 0 ]
