#!/usr/bin/env bash
# The C and C++ examples against live engines (make test-capi): two
# espublish engines and a foreign file in a fresh directory; every example
# binary given must name both engines with their published fields, fresh,
# and report the foreign file as a per-engine error; a bad URI must fail
# with its code. A third engine publishes a cache digest of 4 blocks
# (espublish --cache-blocks 4: the router block hashes of token ids
# 0..2047); the C++ example's router (--prefix-hit) must find the leading
# run of a prompt's blocks in it. A router replica (esreplica) holds 2
# requests on the engines: the C example (--replicas) must show its
# reservations, fresh, and leave it out when it is its own id. Usage:
# live_examples.sh BIN_DIR EXAMPLE...
set -euo pipefail
bin=$1; shift
dir=$(mktemp -d /dev/shm/engine_state_capi.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    exec 3>&- 2>/dev/null || true
    rm -rf "$dir" "$dir".*.log "$dir.err" "$dir.replica.in" "$dir.routers" "$dir.cache"
}
trap cleanup EXIT

publish() {  # id, fields (or --flags)...
    local id=$1; shift
    local sets=()
    for field in "$@"; do
        case $field in --*) sets+=("$field") ;; *) sets+=(--set "$field") ;; esac
    done
    "$bin/espublish" --uri "file://$dir" --engine-id "$id" --duration 60 "${sets[@]}" \
        > "$dir.$id.log" 2>&1 &
    pids+=($!)
}
publish capi-busy num_running=7 num_waiting=3 gpu_blocks_total=100 gpu_blocks_free=25
publish capi-idle flags=1 gpu_blocks_total=50 gpu_blocks_free=50
publish capi-cache --cache-blocks=4
echo "not engine state" > "$dir/junk"

# espublish prints its line after the first publish: wait for both (event, not time).
for id in capi-busy capi-idle capi-cache; do
    for _ in $(seq 600); do
        grep -q "espublish: publishing" "$dir.$id.log" 2>/dev/null && break
        sleep 0.05
    done
    grep -q "espublish: publishing" "$dir.$id.log" || { cat "$dir.$id.log"; echo "$id never published"; exit 1; }
    rm -f "$dir.$id.log"
done

# The replica's stdin is a FIFO this script holds open (fd 3): each line a
# command, each reply a line of its log.
mkfifo "$dir.replica.in"
"$bin/esreplica" --uri "file://$dir" --replica-id capi-r1 --engines capi-busy,capi-idle \
    < "$dir.replica.in" > "$dir.replica.log" 2>&1 &
pids+=($!)
exec 3> "$dir.replica.in"
echo "pick 2 100" >&3
for _ in $(seq 600); do
    grep -q '"held":2' "$dir.replica.log" 2>/dev/null && break
    sleep 0.05
done
grep -q '"held":2' "$dir.replica.log" || { cat "$dir.replica.log"; echo "esreplica never held 2"; exit 1; }

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
    # The C example (esdump-c, esdump-c-asan): the replica's reservations,
    # its 2 requests over its engines, fresh; left out as the reader's own.
    case $name in esdump-c|esdump-c-asan)
    out=$("$example" --replicas - "file://$dir") || { echo "$name --replicas failed:"; echo "$out"; exit 1; }
    check '^replica capi-r1 fresh engines [0-9]+ generation 1 '
    held=$(awk '$2 == "num_requests" { n += $3 } END { print n + 0 }' <<<"$out")
    [ "$held" -eq 2 ] || { echo "$name --replicas: $held requests, not 2:"; echo "$out"; exit 1; }
    out=$("$example" --replicas capi-r1 "file://$dir") || { echo "$name --replicas capi-r1 failed:"; echo "$out"; exit 1; }
    if grep -q '^replica ' <<<"$out"; then echo "$name: its own replica was read:"; echo "$out"; exit 1; fi
    echo "$name: the replica's 2 reserved requests, fresh; left out as its own"
    ;; esac
    case $name in esdump-cpp*) ;; *) continue ;; esac

    # The router: a prompt of 6 blocks that starts with the 4 cached ones;
    # one that leaves them after 2 blocks (its later blocks' hashes chain
    # from the first different one: none is cached); 2 full blocks and a
    # partial one (no hash for the partial block).
    hit() {  # the prompt's token ids, the expected last line
        out=$("$example" --prefix-hit capi-cache "file://$dir" <<<"$1") || { echo "$name --prefix-hit failed:"; echo "$out"; exit 1; }
        check "$2"
    }
    hit "$(seq 0 3071)" '^prompt 3072 tokens 6 blocks leading run 4 \(2048 tokens cached on capi-cache\)$'
    check '^capi-cache version 1 count 4 generation [0-9]+ fresh$'
    check '^block 3 [0-9a-f]{16} cached$'
    check '^block 4 [0-9a-f]{16} -$'
    hit "$(seq 0 1023; seq 70000 71023)" '^prompt 2048 tokens 4 blocks leading run 2 \(1024 tokens cached on capi-cache\)$'
    check '^block 2 [0-9a-f]{16} -$'
    hit "$(seq 0 1100)" '^prompt 1101 tokens 2 blocks leading run 2 \(1024 tokens cached on capi-cache\)$'
    # An engine without a digest: its code, status 1.
    status=0
    "$example" --prefix-hit capi-busy "file://$dir" <<<"$(seq 0 511)" > /dev/null 2> "$dir.err" || status=$?
    if [ "$status" -ne 1 ] || ! grep -q "ES_CODE_NO_CACHE" "$dir.err"; then
        echo "$name --prefix-hit capi-busy: status $status, not 1 with ES_CODE_NO_CACHE:"; cat "$dir.err"; exit 1
    fi
    rm -f "$dir.err"
    echo "$name: the prompt's leading run in capi-cache's digest: 4, 2 and 2 blocks; no digest refused"
done
