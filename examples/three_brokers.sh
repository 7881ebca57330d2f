#!/bin/sh
# Three minou brokers on one machine over Redis with two replicas and three Sentinels:
# the walk-through of docs/cluster.md ("Run three brokers"), as one script.
#
#   sh examples/three_brokers.sh start    # Redis x3, Sentinel x3, minou x3; prints URLs
#   sh examples/three_brokers.sh stop     # stops what start started (by pid file)
#   PLACEMENT=spread sh examples/three_brokers.sh start   # the queues spread over the
#                                         # three brokers instead of one primary
#
# Everything lives under $DIR (default ./minou-cluster). Ports: Redis $REDIS_PORT and
# the two after it, Sentinel $SENTINEL_PORT and the two after it, brokers $BROKER_PORT,
# +10, +20 (their HTTP ports one above each). On several machines, run one Redis, one
# Sentinel and one broker per machine with the same lines and real addresses.
set -eu

DIR=${DIR:-./minou-cluster}
REDIS_PORT=${REDIS_PORT:-6379}
SENTINEL_PORT=${SENTINEL_PORT:-26379}
BROKER_PORT=${BROKER_PORT:-7700}
MINOU=${MINOU:-minou}
PLACEMENT=${PLACEMENT:-primary}  # or spread (docs/cluster.md)

start() {
    mkdir -p "$DIR"
    # The Redis primary and two replicas: every write fsync'd before Redis answers,
    # and no eviction (minou refuses publishes when Redis is full instead).
    for i in 0 1 2; do
        port=$((REDIS_PORT + i))
        mkdir -p "$DIR/redis-$port"
        if [ "$i" -eq 0 ]; then of=""; else of="--replicaof 127.0.0.1 $REDIS_PORT"; fi
        # shellcheck disable=SC2086  # $of is two words or none
        redis-server --port "$port" --bind 127.0.0.1 --dir "$DIR/redis-$port" \
            --appendonly yes --appendfsync always --maxmemory-policy noeviction \
            --daemonize yes --pidfile "$PWD/$DIR/redis-$port.pid" \
            --logfile "$PWD/$DIR/redis-$port.log" $of
    done
    # Three Sentinels: two must agree that the primary is down before a failover.
    for i in 0 1 2; do
        port=$((SENTINEL_PORT + i))
        conf="$DIR/sentinel-$port.conf"  # Sentinel rewrites its file: one each
        printf '%s\n' "port $port" "bind 127.0.0.1" \
            "sentinel monitor mymaster 127.0.0.1 $REDIS_PORT 2" \
            "sentinel down-after-milliseconds mymaster 1000" \
            "sentinel failover-timeout mymaster 5000" > "$conf"
        redis-server "$conf" --sentinel --daemonize yes \
            --pidfile "$PWD/$DIR/sentinel-$port.pid" --logfile "$PWD/$DIR/sentinel-$port.log"
    done
    s=$SENTINEL_PORT
    url="redis+sentinel://127.0.0.1:$s,127.0.0.1:$((s + 1)),127.0.0.1:$((s + 2))/mymaster/0"
    # replicas = 1: a publish is confirmed once a replica has it too (WAIT 1).
    printf '%s\n' "[storage]" "url = \"$url\"" "replicas = 1" "owner_lease = 5.0" \
        "placement = \"$PLACEMENT\"" > "$DIR/minou.toml"
    urls=""
    for i in 0 1 2; do
        port=$((BROKER_PORT + 10 * i))
        "$MINOU" start --config "$DIR/minou.toml" --data "$DIR/broker-$i" \
            --port "$port" --http-port "$((port + 1))" > "$DIR/broker-$i.log" 2>&1 &
        echo $! > "$DIR/broker-$i.pid"
        # The first becomes the primary; the others wait as standbys, relaying (spread:
        # each takes its share of the queues). One after the other: the first makes the
        # admin key.
        n=0
        until grep -q -e "stop with" -e "standby:" "$DIR/broker-$i.log"; do
            n=$((n + 1))
            if [ "$n" -gt 300 ] || ! kill -0 "$(cat "$DIR/broker-$i.pid")" 2>/dev/null; then
                echo "broker $i did not start: see $DIR/broker-$i.log" >&2
                cat "$DIR/broker-$i.log" >&2
                exit 1
            fi
            sleep 0.1
        done
        urls="$urls${urls:+,}minou://127.0.0.1:$port"
    done
    echo "three brokers up: $urls"
    echo "admin key: $DIR/broker-0/admin.key (registered in Redis: valid on every broker)"
    echo "try:"
    echo "  export MINOU_URL=$urls MINOU_KEY=$DIR/broker-0/admin.key MINOU_CLIENT_ID=admin"
    echo "  $MINOU publish orders/v1/1 '{\"total\": 12.5}'"
    echo "  $MINOU cluster"
    if [ "$PLACEMENT" = spread ]; then
        echo "  kill -9 \$(cat $DIR/broker-0.pid)   # the others adopt its queues within owner_lease"
    else
        echo "  kill -9 \$(cat $DIR/broker-0.pid)   # a standby serves within owner_lease"
    fi
}

stop() {
    for pidfile in "$DIR"/broker-*.pid "$DIR"/sentinel-*.pid "$DIR"/redis-*.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
        n=0
        while kill -0 "$pid" 2>/dev/null && [ "$n" -lt 100 ]; do
            n=$((n + 1))
            sleep 0.1
        done
        rm -f "$pidfile"
    done
    echo "stopped (data kept in $DIR)"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
