# Sourced by the H200 scripts (after stage.sh): a head on loopback and agents on this machine, and their end.
#   farm_up                        a head, then one `cuda` agent named h200-gpu with 8 CPUs
#   farm_head; farm_agent NAME BACKENDS CPUS   the same, piece by piece (more agents, other backends)
#   farm_down                      every agent, then the head; their logs copied to $OUT
# Job code runs as root here (--ray-user root): the lent machine is ours alone for the call.
F="python3 -m farm.cli.main"
FARM_PORT=${FARM_PORT:-7710}

farm_head() {
    $F head start --host 127.0.0.1 --port "$FARM_PORT" --ray-user root --detach "$@" 2>&1 | tail -1
}

farm_agent() {  # NAME BACKENDS CPUS [more `farm agent start` flags]
    local name=$1 backends=$2 cpus=$3
    shift 3
    local ca join
    ca=$(python3 -c "import json;print(json.load(open('/tmp/farm-state/head.json'))['ca_hash'])")
    join=$(python3 -c "import json;print(json.load(open('/tmp/farm-state/head.json'))['join_token'])")
    FARM_JOIN_TOKEN=$join $F agent start --head "127.0.0.1:$FARM_PORT" --ca-hash "$ca" --name "$name" \
        --backends "$backends" --cpus "$cpus" --max-foreign-cpu 100 --ray-user root --detach "$@" 2>&1 | tail -1
}

farm_up() {
    farm_head && farm_agent h200-gpu cuda 8
}

farm_down() {
    $F agent stop 2>&1 | tail -1
    $F head stop 2>&1 | tail -1
    [ -n "${OUT:-}" ] && cp /tmp/farm-state/head.log /tmp/farm-state/agents/*/agent.log "$OUT/" 2>/dev/null
    return 0
}
