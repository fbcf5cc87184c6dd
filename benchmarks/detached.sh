#!/usr/bin/env bash
# A command that outlives the device call that starts it: a device call is cut at 10 minutes and the
# processes it leaves are killed when it returns, except one in a process session of its own
# (../.library/device/README.md). So a run longer than a call (the eager loop at 5,000 prompts) starts
# here in one call, and the next calls, chained while the machine is warm, wait for it.
#
#   benchmarks/detached.sh start DIR -- CMD [ARG...]   start CMD in its own session; returns at once
#   benchmarks/detached.sh wait DIR SECONDS            wait up to SECONDS for it, then print its log's end
#
# `wait` exits with CMD's own status once it has ended, or 3 while it still runs (call `wait` again).
# DIR holds the command (cmd), its output (log), its process id (pid) and, once it ended, its status (rc).
set -euo pipefail

usage() { echo "usage: $0 start DIR -- CMD [ARG...] | $0 wait DIR SECONDS" >&2; exit 2; }

[ $# -ge 2 ] || usage
verb=$1 dir=$2
shift 2
case $verb in
start)
    [ "${1:-}" = "--" ] && [ $# -ge 2 ] || usage
    shift
    if [ -e "$dir/pid" ] && [ ! -e "$dir/rc" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
        echo "$0: $dir already runs $(cat "$dir/cmd") (pid $(cat "$dir/pid")); wait for it, or pick another DIR" >&2
        exit 2
    fi
    mkdir -p "$dir"
    rm -f "$dir/rc" "$dir/log"
    printf '%q ' "$@" > "$dir/cmd"
    # setsid: a session of its own, so the call's end does not kill it; the status is written last.
    setsid bash -c 'cd "$1" && bash "$2/cmd" > "$2/log" 2>&1; echo $? > "$2/rc.tmp" && mv "$2/rc.tmp" "$2/rc"' \
        _ "$PWD" "$(cd "$dir" && pwd)" < /dev/null > /dev/null 2>&1 &
    pid=$!
    echo "$pid" > "$dir/pid"
    # Back only once it is a session of its own (the 6th field of /proc/PID/stat, after the name in
    # parentheses): a call that ends sooner would take it along.
    for _ in $(seq 100); do
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || break  # already ended: wait reads its status
        fields=${stat##*) }
        read -r _ _ _ sid _ <<< "$fields"
        [ "$sid" = "$pid" ] && break
        sleep 0.05
    done
    echo "started (pid $pid): $(cat "$dir/cmd")"
    ;;
wait)
    [ $# -eq 1 ] || usage
    [ -e "$dir/cmd" ] || { echo "$0: nothing was started in $dir" >&2; exit 2; }
    end=$((SECONDS + $1))
    while [ ! -e "$dir/rc" ] && [ $SECONDS -lt "$end" ]; do
        sleep 1
    done
    tail -n 40 "$dir/log" 2>/dev/null || true
    if [ -e "$dir/rc" ]; then
        rc=$(cat "$dir/rc")
        echo "ended with status $rc: $(cat "$dir/cmd")"
        exit "$rc"
    fi
    echo "still running (pid $(cat "$dir/pid")): $(cat "$dir/cmd")"
    exit 3
    ;;
*) usage ;;
esac
