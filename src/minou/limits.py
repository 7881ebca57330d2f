"""Every default and limit, named, with the reason."""

from __future__ import annotations

PROTOCOL_VERSION = 1

DEFAULT_PORT = 7700
DEFAULT_HTTP_PORT = 7701
DEFAULT_HOST = "127.0.0.1"  # loopback unless the operator asks for more
DEFAULT_DATA_DIR = "./data"

MAX_MESSAGE_SIZE = 1 << 20  # 1 MiB payload, as NATS' max_payload default
MAX_FRAME_SIZE = 16 << 20  # a batch of publishes may hold many messages
MAX_HEADERS = 64
MAX_HEADER_SIZE = 8 << 10
# Arrays and objects inside one another in a client's JSON (payloads, HTTP bodies, stream
# messages): decoders recurse per level, so a 1 MiB "[[[[..." would exhaust the stack.
MAX_JSON_DEPTH = 64
MAX_CHANNEL_LENGTH = 255
MAX_BATCH = 10_000  # messages in one publish frame
# Subscriptions of one connection (or stream or HTTP client): each costs a scan of the
# channels and groups when made, so thousands would stall the broker for everyone.
MAX_SUBSCRIPTIONS = 256

DEFAULT_PREFETCH = 1  # SPEC §1: per channel config, default 1
MAX_PREFETCH = 100_000
DEFAULT_LEASE_S = 60.0  # an unsettled delivery returns to its queue after this long
MAX_LEASE_S = 12 * 3600.0
DEFAULT_REQUEUE_LIMIT = 10  # then the message goes to _dead/<channel>
DEFAULT_DEDUP_WINDOW_S = 120.0  # SPEC §1: "default 2 minutes"
# Dedup keys held in memory (core/dedup.py: ~37 bytes each, ~48 in RSS; 2 million stay
# under 100 MB). That is a full default window (120 s) up to ~16,000 keyed publishes a
# second (the report that sized it: 6,000/s, 720,000 keys). Faster keyed publishing
# narrows the window instead of growing memory with the rate: past the cap the oldest
# keys expire early, counted and logged (max_dedup_keys raises it).
MAX_DEDUP_KEYS = 2_000_000
MIN_PRIORITY, MAX_PRIORITY = 0, 9  # higher is served first; 0 is the default

# Flow control (DESIGN: bound every buffer).
PUBLISH_PAUSE_BYTES = 32 << 20  # stop reading publishers past this many uncommitted bytes
PUBLISH_RESUME_BYTES = 8 << 20
CONSUMER_WRITE_HIGH = 4 << 20  # stop pushing deliveries to a connection past this
CONSUMER_WRITE_LOW = 1 << 20
BURST_BYTES = 1 << 20  # deliveries per subscription per pump round, so writes can pause us
CONSUMER_HARD_LIMIT = 64 << 20  # then cut it, with an error frame first (nats-server)
SLOW_CONSUMER_GRACE_S = 2.0  # after the cut, time to read the error before the socket drops

# Memory: recent message bodies are kept in memory for fast delivery; older
# ones are read back from storage in pages.
BODY_CACHE_BYTES = 48 << 20
STORAGE_READ_PAGE = 2_000

# Acks, nacks and subscriptions wait at most this long for a commit to share; publishes
# never wait (a commit starts as soon as the writer is free).
SETTLE_COMMIT_DELAY_S = 0.002
SWEEP_INTERVAL_S = 0.25  # leases, delays, TTL
CHECKPOINT_WAL_BYTES = 64 << 20  # copy the WAL into the database past this size (or idle)

# A full disk (or [storage] max_size): publishes are refused, deliveries and acks go on.
# The reserve is a file of this size in the data dir (and as many pages above max_size),
# given back on the first SQLITE_FULL so the broker can still record acks and state.
STORAGE_RESERVE_BYTES = 4 << 20
STORAGE_RESUME_BYTES = 4 << 20  # publishes are accepted again once this much is free
STORAGE_PROBE_S = 1.0  # while full, look at the free space this often
STORAGE_RETRY_S = 1.0  # while full, a failed commit waits this long before the next try
MIN_STORAGE_MAX_SIZE = 1 << 20  # a smaller max_size is surely a mistake
GC_THRESHOLD = 100_000  # allocations before a young-generation collection (default 700)
HELLO_TIMEOUT_S = 10.0

# Connections (docs/http.md, "Connections and timeouts"). Every client socket holds a file
# descriptor: native, HTTP and WebSocket ones count together against max_connections,
# capped by what the descriptor limit leaves once these are set aside.
DEFAULT_MAX_CONNECTIONS = 10_000
# Not client sockets: storage (three SQLite connections x database, WAL and shm), the
# data-directory lock, both listeners, the event loop, stdio, files read on demand
# (config, keys, TLS, the dashboard's static files).
FD_RESERVED = 64
# Sockets accepted only to be refused (an error frame or a 503, then closed): past this
# many at once, a new one is dropped without an answer, so a flood of connects never
# takes the descriptors the budget leaves to everything else.
MAX_REFUSING = 64
# A refused socket is answered when its request (HTTP: a 503) or HELLO (native: the error
# frame) comes, so that its client reads the refusal as the answer; at most this long.
REFUSAL_WAIT_S = 1.0
REFUSAL_LINGER_S = 2.0  # a refused native socket: time to read the error before the close
# HTTP: a request's headers must be complete within this of its first byte, and a new
# connection must have sent its first request's headers within this of connecting
# (slowloris; as the HELLO deadline of native connections).
HTTP_HEADER_TIMEOUT_S = 10.0
# An idle keep-alive HTTP connection is closed after this long without a request: longer
# than the 5 s for which clients such as httpx keep an idle connection, so a client
# reusing one does not race our close.
HTTP_IDLE_TIMEOUT_S = 15.0

# Client
CLIENT_SEND_QUEUE = 100_000
# Publishes per frame: small enough that the broker commits the first frames of a
# burst while it still reads the rest (and confirms come back sooner), large enough
# to keep per-frame costs low.
CLIENT_FRAME_MESSAGES = 256  # messages waiting to be sent or confirmed
CLIENT_RECONNECT_MIN_S = 0.05
CLIENT_RECONNECT_MAX_S = 2.0
CLIENT_REQUEST_TIMEOUT_S = 30.0

# Authentication: what strangers and single clients can make the broker remember.
REPLAY_GUARD_CAPACITY = 100_000  # unexpired token ids of native HELLOs (admins may pass it)
REPLAY_GUARD_PER_CLIENT = 5_000  # of which one client id may hold at most this many
MAX_PENDING_PER_ADDRESS = 20  # clients waiting for approval registered from one address
PENDING_ATTEMPTS = (10, 10.0)  # HELLOs of one pending client id: at most 10 per 10 s

# Amplification: what one small request may make the broker do.
MAX_KEY_LENGTH = 256  # characters of a message key or a dedup key (kept in memory per key)
MAX_BROADCAST_FANOUT = 10_000  # channels one broadcast may be stored in
MAX_BROADCAST_BYTES = 256 << 20  # payload bytes x channels of one broadcast
MAX_PATTERNS_PER_REQUEST = 256  # patterns of one OFFSETS request
MAX_OFFSETS_CHANNELS = 100_000  # channels one OFFSETS answer may list
MAX_POSITION_CHANNELS = 10_000  # channels one POSITION request may move

# Idempotent producers: one small state per (client, producer id, channel), kept in
# memory and stored with the messages. Past the cap the least recently used go (a
# producer whose state went starts afresh: its resends are no longer recognised), and
# so do those unused this long (a week: a client that comes back later is new anyway).
MAX_PRODUCER_STATES = 100_000
PRODUCER_IDLE_S = 7 * 24 * 3600.0
MAX_SESSION_PRODUCER_STATES = 1_024  # a connection's cache of its own states

# Liveness (docs/protocol.md, "Heartbeats"): the interval a client asks for at HELLO is
# kept within these bounds; either side declares the connection dead after hearing
# nothing for HEARTBEAT_MISSES intervals.
DEFAULT_HEARTBEAT_S = 5.0
MIN_HEARTBEAT_S = 0.2
MAX_HEARTBEAT_S = 300.0
HEARTBEAT_MISSES = 2
# A client numbers its publishes per channel and never restarts a channel's numbers (the
# broker would take them for resends): past this many channels, publishes to further
# ones go unnumbered (at-least-once, as without idempotence) so its memory stays bounded.
CLIENT_MAX_NUMBERED_CHANNELS = 100_000
# A client call waits at most this long for its confirm (Client(confirm_timeout=...)).
CLIENT_CONFIRM_TIMEOUT_S = 30.0
# A (re)connection's HELLO must be answered within this: a broker whose process is
# paused accepts TCP connections (the kernel does) but never answers.
CLIENT_HANDSHAKE_TIMEOUT_S = 10.0

# Fair redelivery: per group channel, messages remembered as "came back from member X".
RETURNED_FROM_LIMIT = 10_000

# Consumers that stop reading: what the broker holds for them.
CONSUMER_STALL_S = 30.0  # paused at the write water mark this long with deliveries out: cut
DELIVERY_BUFFER_BUDGET = 128 << 20  # unsent delivery bytes across all connections
BUDGET_SHARE = 256 << 10  # past the budget, a connection holding more gets no deliveries

# Delegated credentials (auth.credentials): a client that proved itself with its key
# hands tasks running elsewhere (Spark executors) a secret bound to its identity.
DEFAULT_CREDENTIAL_TTL_S = 3600.0
MIN_CREDENTIAL_TTL_S = 1.0
MAX_CREDENTIAL_TTL_S = 7 * 24 * 3600.0  # as Kafka's delegation tokens' max lifetime
MAX_CREDENTIALS_PER_CLIENT = 1_000  # unexpired ones; a notebook running a query a minute
MAX_CREDENTIALS = 50_000  # ... and all clients together (~200 bytes each)
