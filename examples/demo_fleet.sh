#!/usr/bin/env bash
# The fake fleet end to end (`make demo-fleet`): ENGINES `essim serve` engines
# publishing engine state into DIR, `esroute` in front of them reading it,
# and `essim replay` sending the agentic trace through esroute while
# `esdump --watch` shows the engines live; at the end, the replay's latency
# table and esroute's decisions per engine. Every process is stopped on exit
# (Ctrl-C included) and DIR removed.
#
# usage: examples/demo_fleet.sh BIN_DIR DIR DURATION_S [ENGINES]
# (REPLAY_ARGS: more essim replay flags, e.g. "--limit 10" for a short run)
set -euo pipefail
bin=$1 dir=$2 duration=$3 engines=${4:-4}
time_scale=10
[ -x "$bin/essim" ] && [ -x "$bin/esroute" ] && [ -x "$bin/esdump" ] ||
    { echo "demo-fleet: $bin lacks essim, esroute or esdump: build them (make bins)" >&2; exit 1; }

rm -rf "$dir"
mkdir -p "$dir"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait "${pids[@]}" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits until FILE has N lines (a child's ready lines), at most 10 s.
ready() {
    local file=$1 lines=$2 what=$3
    for _ in $(seq 100); do
        [ "$(wc -l < "$file")" -ge "$lines" ] && return 0
        sleep 0.1
    done
    echo "demo-fleet: $what did not start; its output:" >&2
    cat "$file" "$file.err" >&2 || true
    exit 1
}

uri=file://$dir/state
"$bin/essim" serve --engines "$engines" --listen-base 127.0.0.1:0 --time-scale "$time_scale" \
    --period-ms 5 --uri "$uri" > "$dir/engines" 2> "$dir/engines.err" &
pids+=($!)
ready "$dir/engines" "$engines" "essim serve"

route=()
while read -r id url; do route+=(--engine "$id=$url"); done < "$dir/engines"
"$bin/esroute" --listen 127.0.0.1:0 --poll-ms 5 --uri "$uri" "${route[@]}" \
    > "$dir/esroute" 2> "$dir/esroute.err" &
pids+=($!)
ready "$dir/esroute" 1 "esroute"
proxy=http://$(sed -n 's/^esroute listening on //p' "$dir/esroute")
echo "demo-fleet: $engines engines (essim serve, time scale $time_scale), esroute at $proxy"

# The trace: 32 agentic sessions (146 modelled seconds), ten times denser
# in wall time: about 15 s.
# shellcheck disable=SC2086
"$bin/essim" replay --format agentic --sessions 32 --time-scale "$time_scale" \
    --url "$proxy" --out "$dir/replay" ${REPLAY_ARGS:-} > "$dir/replay.txt" 2> "$dir/replay.err" &
replay=$!
pids+=("$replay")

"$bin/esdump" --uri "$uri" --watch --interval 500 --count $(( duration * 2 ))

echo "demo-fleet: waiting for the replay to finish"
if ! wait "$replay"; then
    echo "demo-fleet: essim replay failed:" >&2
    cat "$dir/replay.err" >&2
    exit 1
fi
echo
echo "essim replay through esroute (latencies in modelled seconds):"
cat "$dir/replay.txt"
echo "esroute's decisions per engine:"
curl -s "$proxy/metrics" | grep '^esroute_decisions_total' || true
