#!/usr/bin/env bash
# The C and C++ examples against live engines (make test-capi): two
# espublish engines and a foreign file in a fresh directory; every example
# binary given must name both engines with their published fields, fresh,
# and report the foreign file as a per-engine error; a bad URI must fail
# with its code. Usage: live_examples.sh BIN_DIR EXAMPLE...
set -euo pipefail
bin=$1; shift
dir=$(mktemp -d /dev/shm/engine_state_capi.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$dir" "$dir".*.log "$dir.err"
}
trap cleanup EXIT

publish() {  # id, fields...
    local id=$1; shift
    local sets=()
    for field in "$@"; do sets+=(--set "$field"); done
    "$bin/espublish" --uri "file://$dir" --engine-id "$id" --duration 60 "${sets[@]}" \
        > "$dir.$id.log" 2>&1 &
    pids+=($!)
}
publish capi-busy num_running=7 num_waiting=3 gpu_blocks_total=100 gpu_blocks_free=25
publish capi-idle flags=1 gpu_blocks_total=50 gpu_blocks_free=50
echo "not engine state" > "$dir/junk"

# espublish prints its line after the first publish: wait for both (event, not time).
for id in capi-busy capi-idle; do
    for _ in $(seq 600); do
        grep -q "espublish: publishing" "$dir.$id.log" 2>/dev/null && break
        sleep 0.05
    done
    grep -q "espublish: publishing" "$dir.$id.log" || { cat "$dir.$id.log"; echo "$id never published"; exit 1; }
    rm -f "$dir.$id.log"
done

for example in "$@"; do
    name=$(basename "$example")
    out=$("$example" "file://$dir") || { echo "$name failed:"; echo "$out"; exit 1; }
    check() {
        grep -Eq "$1" <<<"$out" || { echo "$name: no line matching '$1' in:"; echo "$out"; exit 1; }
    }
    check '^capi-busy +fresh +7 +3 +0\.750 +[0-9.]+ +[0-9.]+ +1$'
    check '^capi-idle +fresh +0 +0 +0\.000 +[0-9.]+ +[0-9.]+ +1$'
    check '^error junk ES_CODE_NOT_ENGINE_STATE: .*bad magic'
    # Exactly 1 (the examples' failure status): a crash or a sanitizer
    # report exits otherwise.
    status=0
    "$example" "ftp://nowhere" > /dev/null 2> "$dir.err" || status=$?
    if [ "$status" -ne 1 ]; then
        echo "$name: ftp://nowhere exited with status $status, not 1:"; cat "$dir.err"; exit 1
    fi
    grep -q "ES_CODE_BAD_URI" "$dir.err" || { echo "$name: bad URI message:"; cat "$dir.err"; exit 1; }
    rm -f "$dir.err"
    echo "$name: both engines fresh with their fields, the foreign file reported, a bad URI refused"
done
