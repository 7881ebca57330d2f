"""Every default and limit, named, with the reason."""

from __future__ import annotations

PROTOCOL_VERSION = 1

DEFAULT_PORT = 7700
DEFAULT_HTTP_PORT = 7701
DEFAULT_HOST = "127.0.0.1"  # loopback unless the operator asks for more
DEFAULT_DATA_DIR = "./data"

MAX_MESSAGE_SIZE = 1 << 20  # 1 MiB payload, as NATS' max_payload default
MAX_FRAME_SIZE = 16 << 20  # a batch of publishes may hold many messages
# Frames of a native connection before its HELLO is welcomed: a HELLO holds a token (4 KiB
# at most), a public key (4 KiB) and a few short fields. Frames of MAX_FRAME_SIZE from a
# stranger, who needs no key to send them, were read whole: 10 connections that sent 16 MB
# of a frame each and no HELLO held +150 MiB for hello_timeout (max_connections of them,
# 160 GB). Past it the connection is refused at the frame's header, as an HTTP request
# whose head passes MAX_HTTP_HEAD_BYTES.
MAX_HELLO_FRAME_SIZE = 64 << 10
# Unfinished frames and request bodies (server/input_budget.py). A connection holds a
# HELLO's worth of one on its own; a larger one is reserved first from a budget of
# INPUT_BUDGET_BYTES over every connection (or 4 of the largest frames allowed, if more),
# a quarter of it per client: one authenticated client parking 16 MiB of a frame in every
# connection slot it could open held the broker's memory without end. A reservation must
# arrive at INPUT_MIN_RATE on average after INPUT_GRACE_S (a 16 MiB frame: 266 s), or
# the connection is cut.
INPUT_SMALL_BYTES = MAX_HELLO_FRAME_SIZE
INPUT_BUDGET_BYTES = 256 << 20
INPUT_CLIENT_SHARE = 4  # a client may reserve 1/4 of the budget
INPUT_MIN_RATE = 64 << 10  # bytes a second
INPUT_GRACE_S = 10.0
# Input whose size is not known ahead (a WebSocket message, a Redis protocol command)
# reserves its room as it arrives, this much at a time.
INPUT_STEP_BYTES = 1 << 20
MAX_HEADERS = 64
MAX_HEADER_SIZE = 8 << 10
# Arrays and objects inside one another in a client's JSON (payloads, HTTP bodies, stream
# messages): decoders recurse per level, so a 1 MiB "[[[[..." would exhaust the stack.
MAX_JSON_DEPTH = 64
MAX_CHANNEL_LENGTH = 255
MAX_BATCH = 10_000  # messages in one publish frame
# Subscriptions of one connection (or stream or HTTP client): each costs a scan of the
# channels and groups when made, so thousands would stall the broker for everyone.
MAX_HTTP_HEAD_BYTES = 64 << 10  # an HTTP request line and headers (a token is at most 4 KiB)
MAX_CLIENT_ID = 200  # characters of a client id (HELLO refuses longer ones)
MAX_SUBSCRIPTIONS = 256
MAX_GROUP_NAME = 512  # characters of a group or listener name (a Redis door's group@stream fits)
MAX_GROUPS = 20_000  # consumer groups and durable listeners the broker keeps (each for good)
MAX_GROUPS_PER_CLIENT = 2_000  # ... of which one client (not an admin) may make
MAX_PATTERNS_PER_GROUP = 10_000  # patterns a group reads (a channel by name is one)
# ... and over every group (~270 B each, held for good): one client's 2,000 groups of
# 10,000 patterns would be 20 million (~5 GiB)
MAX_GROUP_PATTERNS = 1_000_000
MAX_GROUP_PATTERNS_PER_CLIENT = 100_000  # over the groups one client (not an admin) made

DEFAULT_PREFETCH = 1  # SPEC §1: per channel config, default 1
MAX_PREFETCH = 100_000
DEFAULT_LEASE_S = 60.0  # an unsettled delivery returns to its queue after this long
MAX_LEASE_S = 12 * 3600.0
DEFAULT_REQUEUE_LIMIT = 10  # then the message goes to _dead/<channel>
# Request/reply inboxes (_inbox/v1/<client>) unless channels."_inbox/v1" says otherwise:
# replies arrive in parallel (a requester has many requests out), expire unread after
# INBOX_TTL_S, and past INBOX_MAX_ITEMS unread the oldest reply goes.
INBOX_PREFETCH = 1_000
INBOX_TTL_S = 300.0
INBOX_MAX_ITEMS = 10_000
# An inbox whose owner is gone (no listener connected, nothing published or delivered)
# is removed after this long, with its listener (channel option expire_idle).
INBOX_EXPIRE_IDLE_S = 600.0
# Channels removed by idle expiry whose next seq is kept (a channel of the same name made
# later goes on from it): past this many the oldest are forgotten, their rows with them.
MAX_RETIRED_CHANNELS = 100_000
# Key-value buckets (docs/kv.md), unless kv."<bucket>" says otherwise: revisions kept
# per key, and the revisions a bucket holds (deletes included; the core indexes each
# in memory, so this bounds that memory too).
KV_HISTORY = 1
MAX_KV_HISTORY = 64
KV_MAX_REVISIONS = 100_000
# Over every bucket: a revision is ~100 B of index, and each key ~170 B more and its
# text (a key's revisions share one string). Measured from outside (bench/
# kv_index_memory.py), a broker grows ~440 B a revision of its own 8-character key,
# ~650 B with 256 characters (2,000,000: ~0.9 and ~1.3 GB), ~270-300 B a revision of keys
# with 64 revisions each.
MAX_KV_REVISIONS_TOTAL = 2_000_000
# ... and the characters of their keys, each key once, over every bucket: 2,000,000 keys
# of 64 characters fit; the longest keys (256) stop at ~520,000 (~340 MB), so the
# worst case is short keys' (~0.9 GB), not 1.3 GB.
MAX_KV_KEY_BYTES = 128 << 20
MAX_KV_REVISION = 1 << 62  # a revision (a seq) given in a compare-and-set or a read
MAX_KV_WAIT_S = 30.0  # a watch's long poll: answered empty after at most this long
# Long polls waiting at once over all clients: KV watches, and as many channels.wait
# (federation links, XREAD BLOCK); each holds a timer, and over HTTP a socket.
MAX_KV_WAITERS = 10_000
# ... of which one client (not an admin) may have waiting, both kinds together and over
# all its connections: else one client could hold them all and every other be refused.
MAX_LONG_POLLS_PER_CLIENT = 100
DEFAULT_KV_PAGE = 1_000
MAX_KV_PAGE = 10_000
# A page of KV revisions (kv.history, kv.read) holds at most this many bytes of
# ``core.log.read_weight`` (history: always one revision; read: and one more at most):
# the native door answers each stored JSON value transcoded into msgpack, up to 2.25
# times its JSON (a float "1e5," becomes 9 bytes), so a page stays under MAX_FRAME_SIZE;
# a whole history (64 revisions of 1 MiB), or STORAGE_READ_BYTES of values, would not.
KV_PAGE_BYTES = 4 << 20
DEFAULT_REQUEST_TIMEOUT_S = 5.0  # client.request(), minou request, POST /v1/request
MAX_REQUEST_TIMEOUT_S = 300.0  # a request waits at most this long (HTTP holds a socket)
# durability = "interval" (issue 19): confirmed once written to the OS, made durable on
# the disk (fsync) at most this long after (Redis's appendfsync everysec, NATS's sync)
DEFAULT_SYNC_INTERVAL_S = 0.05
MAX_SYNC_INTERVAL_S = 10.0  # longer would leave minutes of confirms to a power cut
DEFAULT_DEDUP_WINDOW_S = 120.0  # SPEC §1: "default 2 minutes"
# Dedup keys held in memory (core/dedup.py: ~37 bytes each, ~48 in RSS; 2 million stay
# under 100 MB). That is a full default window (120 s) up to ~16,000 keyed publishes a
# second (the report that sized it: 6,000/s, 720,000 keys). Faster keyed publishing
# narrows the window instead of growing memory with the rate: past the cap the oldest
# keys expire early, counted and logged (max_dedup_keys raises it).
MAX_DEDUP_KEYS = 2_000_000
MIN_PRIORITY, MAX_PRIORITY = 0, 9  # higher is served first; 0 is the default
# ttl and delay of a message (and a nack's delay): ten years is surely a mistake beyond.
MAX_DELAY_S = 10 * 365 * 86400.0
# Messages with a priority or a delay that wait, over every channel: each is held in
# memory (in its channel and in every group reading it: ~800 B with four groups), so a
# writer scheduling without end would grow the broker without end.
MAX_SCHEDULED_MESSAGES = 1_000_000

# Flow control (DESIGN: bound every buffer).
PUBLISH_PAUSE_BYTES = 32 << 20  # stop reading publishers past this many uncommitted bytes
PUBLISH_RESUME_BYTES = 8 << 20
CONSUMER_WRITE_HIGH = 4 << 20  # stop pushing deliveries to a connection past this
CONSUMER_WRITE_LOW = 1 << 20
BURST_BYTES = 1 << 20  # deliveries per subscription per pump round, so writes can pause us
CONSUMER_HARD_LIMIT = 64 << 20  # then cut it, with an error frame first (nats-server)
SLOW_CONSUMER_GRACE_S = 2.0  # after the cut, time to read the error before the socket drops
# A native client's READs: at most this many answered at once, and none while more than
# READ_ANSWERS_UNSENT bytes wait to be read by it; the ones after wait (so do its other
# frames: nothing more is read from it) until it reads some of what it was sent.
READS_PER_CONNECTION = 4
READ_ANSWERS_UNSENT = 16 << 20

# Memory: recent message bodies are kept in memory for fast delivery; older
# ones are read back from storage in pages.
BODY_CACHE_BYTES = 48 << 20
STORAGE_READ_PAGE = 2_000
# ... and at most this many bytes a page (``core.log.read_weight``: payloads, headers,
# names; always one message): a backlog of
# 1 MiB messages read back 2,000 at a time held 2 GiB, and a read answered in one frame
# must stay under MAX_FRAME_SIZE.
STORAGE_READ_BYTES = 8 << 20

# Acks, nacks and subscriptions wait at most this long for a commit to share; publishes
# never wait (a commit starts as soon as the writer is free).
SETTLE_COMMIT_DELAY_S = 0.002
# A commit this small is written to the OS by the event loop, not handed to the writer
# thread (server/app.py ``_write_here``): ~0.1-0.4 ms of SQLite writes; an fsync
# channel's fdatasync of it still runs on the writer thread before its answer. 64, not
# 16: an HTTP client's 64 keep-alive connections commit ~32-64 publishes at a time, and
# on the writer thread (the GIL passed back and forth through every statement) an
# ``interval`` channel took 16k requests a second, 23k on the loop (docs/benchmarks.md,
# "HTTP publish on an interval channel").
COMMIT_HERE_MAX_MESSAGES = 64
COMMIT_HERE_MAX_BYTES = 64 << 10
# One that took the loop longer than STALL, or SLOW_COUNT longer than SLOW within
# SLOW_WINDOW (a slow disk or page cache, not the loop losing its CPU now and then),
# sends them all to the writer thread for BACKOFF.
COMMIT_HERE_SLOW_S = 0.005
COMMIT_HERE_SLOW_COUNT = 3
COMMIT_HERE_SLOW_WINDOW_S = 10.0
COMMIT_HERE_STALL_S = 0.1
COMMIT_HERE_BACKOFF_S = 30.0
SWEEP_INTERVAL_S = 0.25  # leases, delays, TTL
# A sweep that comes this much later than SWEEP_INTERVAL_S means the broker itself was not
# running (stopped, frozen, its loop held): before it expires leases, it serves what its
# sockets got meanwhile (acks sent in time) for STALL_GRACE_S.
STALL_S = 1.0
STALL_GRACE_S = 0.5
DRAIN_COMMIT_WAIT_S = 5.0  # a soft stop waits this long for the last acks' commit
EXPIRY_LOG_LINES = 10  # channels expired in one scan logged one by one; the rest counted
CHECKPOINT_WAL_BYTES = 64 << 20  # copy the WAL into the database past this size (or idle)
# A segment (one channel's messages of one commit) this large is written to a body file
# beside the database instead of SQLite's pages: written once, not WAL then checkpoint,
# and not page by page (issue 19, item 5). Below it, one fsync per commit is cheaper.
BODY_FILE_MIN_BYTES = 256 << 10
BODY_FILE_LIMIT_BYTES = 64 << 20  # then the next body file starts

# A full disk (or [storage] max_size): publishes are refused, deliveries and acks go on.
# The reserve is a file of this size in the data dir (and as many pages above max_size),
# given back on the first SQLITE_FULL so the broker can still record acks and state.
STORAGE_RESERVE_BYTES = 4 << 20
WAL_HEADROOM_BYTES = 8 << 20  # disk kept beyond the WAL's size so a checkpoint can take it in
# The WAL is written out to this size (at most half of wal_checkpoint: where a RESTART
# starts it over) when storage opens: a commit then writes over blocks the file has,
# and its fdatasync has no file size to make durable, ~0.1 ms (40 %) less here
# (PostgreSQL's wal_init_zero, for the same reason). None with a max_size quota.
WAL_PREFILL_BYTES = 32 << 20
STORAGE_RESUME_BYTES = 4 << 20  # publishes are accepted again once this much is free
# Several brokers on one Redis: a standby takes over this long after the primary's
# last lease renewal (renewed every third of it); configurable within these bounds.
OWNER_LEASE_S = 5.0
MIN_OWNER_LEASE_S = 0.5
MAX_OWNER_LEASE_S = 300.0
STORAGE_PROBE_S = 1.0  # while full, look at the free space this often
STORAGE_RETRY_S = 1.0  # while full, a failed commit waits this long before the next try
MIN_STORAGE_MAX_SIZE = 1 << 20  # a smaller max_size is surely a mistake
MIN_CHECKPOINT_WAL_BYTES = 1 << 20  # [storage] wal_checkpoint: a smaller one is surely a mistake
GC_THRESHOLD = 100_000  # allocations before a young-generation collection (default 700)
HELLO_TIMEOUT_S = 10.0

# Connections (docs/http.md, "Connections and timeouts"). Every client socket holds a file
# descriptor: native, HTTP and WebSocket ones count together against max_connections,
# capped by what the descriptor limit leaves once these are set aside.
DEFAULT_MAX_CONNECTIONS = 10_000
# ... of which one client (not an admin, not a broker's link) may hold this many
# authenticated: native and WebSocket sessions and Redis protocol connections once AUTHed.
# Without it one client could take every slot and have every other refused.
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 1_000
# Channels the broker holds (config max_channels): each costs ~2 KB of memory for good
# (its state, its groups' cursors, a stored row) and is made by its first publish or
# named reader, so without a bound any client with write rights could make millions.
DEFAULT_MAX_CHANNELS = 100_000
# ... of which one client's inboxes (_inbox/v1/<client>!<instance>, any client, admins
# too) may be this share: every client writes and reads its own inboxes without a rule,
# under any instance name, so a client allowed nothing else made channels until the
# broker held max_channels, and every other client's new channel was refused. A tenth
# (10,000 by default) leaves a service that makes a client object per job (an inbox
# each, gone 10 minutes after it) ~16 of them a second.
INBOXES_SHARE = 10
# Not client sockets: storage (three SQLite connections x database, WAL and shm), the
# data-directory lock, both listeners, the event loop, stdio, files read on demand
# (config, keys, TLS, the dashboard's static files).
FD_RESERVED = 64
# At max_connections, a socket that is not logged in (no HELLO or AUTH yet) or is between
# HTTP requests gives its place to a new one once it has been so this long, oldest first
# (server/admission.py): younger ones are clients that just connected.
EVICT_MIN_IDLE_S = 1.0
# Sockets accepted only to be refused (an error frame or a 503, then closed): past this
# many at once, a new one is dropped without an answer, so a flood of connects never
# takes the descriptors the budget leaves to everything else.
MAX_REFUSING = 64
# A refused socket is answered when its request (HTTP: a 503) or HELLO (native: the error
# frame) comes, so that its client reads the refusal as the answer; at most this long.
REFUSAL_WAIT_S = 1.0
REFUSAL_LINGER_S = 2.0  # a refused native socket: time to read the error before the close
# HTTP answers written and not read, over every HTTP socket (server/http_unread.py):
# past it, the sockets that have read nothing for EVICT_MIN_IDLE_S are cut, the fullest
# first. Each holds its whole answer (a KV page 4 MiB, a browse page 8 MiB) until read:
# 100 sockets asking a KV watch page and reading nothing held 434 MiB for good.
HTTP_UNSENT_BYTES = 128 << 20
# HTTP: a request's headers must be complete within this of its first byte, and a new
# connection must have sent its first request's headers within this of connecting
# (slowloris; as the HELLO deadline of native connections).
HTTP_HEADER_TIMEOUT_S = 10.0
# HTTP requests pipelined behind the one being answered, per connection. uvicorn queues one
# per head it parses and read on after every answer, however long the queue: six sockets
# pipelining GET /health (no token needed) without reading the answers held +1.2 GB in
# 5 s (~1 KB a queued request). Past it the connection answers those and closes; the rest
# is not done (the client sends it again, as after any close).
MAX_HTTP_PIPELINE = 100
# An idle keep-alive HTTP connection is closed after this long without a request: longer
# than the 5 s for which clients such as httpx keep an idle connection, so a client
# reusing one does not race our close.
HTTP_IDLE_TIMEOUT_S = 15.0
# An answer sent with "connection: close" while the request's body still arrives (a 413, a
# 408): the rest is read and dropped this long before the close, as nginx's lingering
# close, since closing with unread data sends a reset that can destroy the answer.
HTTP_LINGER_S = 2.0

# Client
CLIENT_SEND_QUEUE = 100_000
# Publishes per frame: small enough that the broker commits the first frames of a
# burst while it still reads the rest (and confirms come back sooner), large enough
# to keep per-frame costs low.
CLIENT_FRAME_MESSAGES = 256  # messages waiting to be sent or confirmed
# ... and at most this many payload bytes (always one message): a burst of large
# messages goes out in several frames, each well under MAX_FRAME_SIZE.
CLIENT_FRAME_BYTES = 8 << 20
CLIENT_RECONNECT_MIN_S = 0.05
CLIENT_RECONNECT_MAX_S = 2.0
CLIENT_STANDBY_RETRY_S = 0.25  # after a STANDBY answer: a takeover is near, try again soon
CLIENT_REQUEST_TIMEOUT_S = 30.0

# Authentication: what strangers and single clients can make the broker remember.
REPLAY_GUARD_CAPACITY = 100_000  # unexpired token ids of native HELLOs (admins may pass it)
REPLAY_GUARD_PER_CLIENT = 5_000  # of which one client id may hold at most this many
MAX_PENDING_PER_ADDRESS = 20  # clients waiting for approval registered from one address
PENDING_ATTEMPTS = (10, 10.0)  # HELLOs of one pending client id: at most 10 per 10 s
MIN_SECRET_CHARS = 16  # [auth] broker_token: a shorter one is a password, not a secret
# Clients waiting for approval, from all addresses: unknown clients cannot grow the
# registry without bound (an admin reviews each one).
MAX_PENDING_CLIENTS = 1_000
# Clients the registry holds, whatever their status (config max_clients): each is kept in
# memory and stored for good (~10 KB with a 200-character id), and an auto-accepting rule
# ("billing-*") registered one per HELLO to anyone with a fresh key pair (600/s from one
# socket). Past it a new id is refused; registered clients connect as before.
DEFAULT_MAX_CLIENTS = 100_000
# New ids auto-accepted from one address: at most 100 per 60 s (pending ones are bounded
# by MAX_PENDING_PER_ADDRESS), so one socket cannot fill max_clients in minutes. A host
# starting a fleet of workers, each its own id, registers them at once (a test of slow
# consumers registers 22 within a second, all from 127.0.0.1).
REGISTRATIONS_PER_ADDRESS = (100, 60.0)
MAX_PUBLIC_KEY_BYTES = 4_096  # a PEM key presented at registration: RSA-4096 is ~800 bytes
# Keys (client ids, addresses) one attempt limiter tracks: past it, keys whose window ended
# are forgotten and, if all are live, new keys are refused (a flood of ids is not kept).
MAX_ATTEMPT_KEYS = 10_000
MAX_TOKEN_BYTES = 4_096  # a real token is ~300 bytes; more is an attack or a mistake
MAX_TOKEN_LIFETIME_S = 3600.0  # exp - iat: tokens are meant to be short-lived
DEFAULT_TOKEN_TTL_S = 60.0  # what the client signs for: long enough for a slow handshake
CLOCK_LEEWAY_S = 5.0  # exp and iat are checked this loosely: clocks of hosts differ a little
MAX_JTI_CHARS = 128  # a random id (minou's are 24 characters); the guard stores each one
MIN_RSA_BITS = 2048  # NIST SP 800-131A disallows smaller RSA keys for signatures
# Verified HTTP bearer tokens kept until they expire, so a token reused per request is not
# verified (a signature check) again; cleared when full.
HTTP_TOKEN_CACHE = 10_000
# Per-Access answer caches and the per-Rules client cache: a client probing many names
# cannot grow memory; clearing when full is enough, a real client's working set is small.
RULES_CACHE_ENTRIES = 4_096
# Security log lines (oplog: refused logins, pending clients, failed handshakes, slow
# requests): a client can cause them at will, so per kind at most this many per window,
# then one summary: a flood of bad logins costs a few lines, not a full disk.
SECURITY_LOG_LINES = 20
SECURITY_LOG_WINDOW_S = 10.0
# A federation pipe's lines about what its destination refuses (a dead-lettered message,
# a channel that waits): a destination refusing every message (a schema, a rule) wrote
# one line per message, 5,000 lines for 5,000 messages. Per pipe at most this many per
# window, then one count; `minou federation` counts them all.
FEDERATION_LOG_LINES = 10
FEDERATION_LOG_WINDOW_S = 60.0
# Transactions a federation pipe staged on its destination and could not abort (the
# connection was lost between STAGE and TXN_COMMIT): it aborts them on its next
# connection, rather than have them hold the destination's staging room (its identity's
# 128 MiB, MAX_STAGED_BYTES_PER_CLIENT) for STAGED_TTL_S. One per failed page; the
# oldest beyond this many are left to expire.
FEDERATION_ORPHANS_KEPT = 64

# Amplification: what one small request may make the broker do.
MAX_KEY_LENGTH = 256  # characters of a message key or a dedup key (kept in memory per key)
MAX_BROADCAST_FANOUT = 10_000  # channels one broadcast may be stored in
MAX_BROADCAST_BYTES = 256 << 20  # payload bytes x channels of one broadcast
MAX_PATTERNS_PER_REQUEST = 256  # patterns of one OFFSETS request
MAX_OFFSETS_CHANNELS = 100_000  # channels one OFFSETS answer may list
SEQS_AT_SLICE = 500  # channels an OFFSETS "at" looks up in storage per turn of the reader
# Retention (a channel's settled messages kept for replay): a channel whose settled ones
# were all too young to go is looked at again when the oldest can (its publish time in
# memory), else after a tenth of its retention, between 1 s and RETENTION_RECHECK_S.
# Each tick (a second) walks RETENTION_WALK_SLICE channels, the next ones the next tick
# (a walk of 100,000 held the loop 25-70 ms each second; now one takes 10 s), and looks
# up at most RETENTION_LOOKS_PER_TICK of them in storage, a RETENTION_LOOK_SLICE a turn
# of the reader thread (the rest wait for the walk's next round).
RETENTION_RECHECK_S = 60.0
RETENTION_WALK_SLICE = 10_000
RETENTION_LOOKS_PER_TICK = 5_000
RETENTION_LOOK_SLICE = 500
# ... and it tries the broker's channels against its patterns this many a turn of the
# event loop (~1 us each: ~6 ms a turn), so other clients' frames go between the turns
# of a lookup over 100,000 channels (whole, 50,000 held the loop ~60 ms a request); so
# does an OFFSETS without "at" whose wildcards meet more channels than this.
OFFSETS_MATCH_SLICE = 5_000
# OFFSETS with "at" being answered at once for one client (not an admin), over all its
# connections; past it the request is refused at once, before any matching. Each costs
# the loop ~70 ms and the one reader thread a lookup per channel for 50,000 channels:
# 20 of them sent at once from a few connections of one client held every other
# client's PING ~1.2 s. A reader asks one at a time (Spark's driver, once per query it
# plans), so 4 lets a client plan 4 queries at once, as a connection has 4 READs.
# The default of the setting max_offsets_at_per_client (reloadable).
MAX_OFFSETS_AT_PER_CLIENT = 4
# ... and what the setting may be raised to: each lookup being answered may hold an
# answer of MAX_OFFSETS_CHANNELS channels (~10 MB) and ~70 ms of the loop per 50,000
# channels, so past a few hundred one client could hold the broker for minutes.
MAX_OFFSETS_AT_PER_CLIENT_SETTING = 1_000
# Names an admin view (list, queues, a queue's page, metrics) gives of one group's
# patterns or one channel's readers; the answer says how many there are in all. One
# client's 7 groups of 10,000 patterns of 255 characters made `list` a 17 MB answer,
# over MAX_FRAME_SIZE: the admin's client dropped the connection and `minou list` failed.
MAX_LISTED_NAMES = 100
# Admin listings of everything registered (clients.list, credentials.list, kv.buckets)
# answer a page at a time, sorted by name, as kv.keys does: 200,000 registered keys
# (an auto-accepting rule, pending approvals) listed whole were ~67 MB, over
# MAX_FRAME_SIZE, and no admin view could show anyone. A client's entry is ~340 bytes
# with a few rule patterns: the largest page stays a few MB, with room for long rules.
DEFAULT_ADMIN_PAGE = 1_000
MAX_ADMIN_PAGE = 5_000
MAX_POSITION_CHANNELS = 10_000  # channels one POSITION request may move
# HTTP publishes in one POST /v1/messages: the body is decoded whole, into one object per
# message, before the first is checked (MAX_BATCH is the native frame's, read as it goes).
MAX_BATCH_HTTP = 1_000
MAX_BROWSE = 1_000  # messages one admin browse page reads back from storage and encodes
DEFAULT_BROWSE = 50  # ... when the request names no limit: a screenful
MAX_DELETE = 1_000  # messages one delete (XDEL, the dashboard) names at once
MAX_REQUEUE = 100_000  # dead letters one requeue reads and moves per channel
DEFAULT_REQUEUE = 10_000  # ... when the request names no limit
MAX_REQUEUE_BYTES = 64 << 20  # ... and at most this much of them (``more`` says more wait)
# from_seq of a browse: the integers every JSON client reads exactly (a double's 53 bits).
MAX_FROM_SEQ = 2**53

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
# Deliveries out and not settled keep their messages (core/in_flight.py): the bytes all
# subscriptions may hold (in_flight_bytes), what one may hold past that, and what one
# may hold at most; one holding nothing always gets a message. A delivery weighs what
# its message holds in memory (core.log.held_weight: headers ~140 B each, the key, at
# least payload + 512): weighed by their text, header-heavy messages held 8 x the bound.
IN_FLIGHT_BYTES = 512 << 20
IN_FLIGHT_SHARE = 1 << 20
IN_FLIGHT_PER_SUBSCRIPTION = 64 << 20

# Delegated credentials (auth.credentials): a client that proved itself with its key
# hands tasks running elsewhere (Spark executors) a secret bound to its identity.
DEFAULT_CREDENTIAL_TTL_S = 3600.0
MIN_CREDENTIAL_TTL_S = 1.0
MAX_CREDENTIAL_TTL_S = 7 * 24 * 3600.0  # as Kafka's delegation tokens' max lifetime
MAX_CREDENTIALS_PER_CLIENT = 1_000  # unexpired ones; a notebook running a query a minute
MAX_CREDENTIALS = 50_000  # ... and all clients together (~200 bytes each)
MAX_PURPOSE_CHARS = 200  # a credential's purpose: a note for the admin who lists them

# HTTP consumers (server/http_consumers.py): a long poll holds a request, a consumer holds
# a subscription, so both are bounded in time.
MAX_HTTP_WAIT_S = 30.0  # ?wait= of a consume: well under nginx's 60 s proxy_read_timeout
MIN_HTTP_WAIT_S = 0.05  # even wait=0 gives the broker this moment to hand over a ready message
HTTP_CONSUMER_IDLE_S = 60.0  # unused this long (and its lease) with nothing unsettled: closed
# Prefetch of one /v1/stream subscription: deliveries out and not yet settled, each leased
# and held by the broker until it is.
MAX_STREAM_PREFETCH = 1_000
# The Redis door: an XRANGE / XREVRANGE answer is gathered whole before it is sent (a
# RESP reply cannot be streamed and then fail); past this (payload + 512 B an entry) it
# is refused with RANGE_TOO_LARGE and the client reads the range in parts with COUNT.
RESP_RANGE_BYTES = 64 << 20
RESP_RANGE_TOTAL_BYTES = 128 << 20  # ... and all those being gathered at once, together
# Redis consumer names (XGROUP CREATECONSUMER, XREADGROUP, XCLAIM) are kept per group in
# memory, as Redis keeps them: a name is at most this many bytes (hostname + pid + a uuid
# fit; 1,000 names of 512 KiB held 513 MiB), a group keeps this many, and the broker this
# many over every group (groups are MAX_GROUPS: per group alone, gigabytes). A name not
# used for resp_groups.IDLE_S that holds no pending entry is forgotten.
MAX_CONSUMER_NAME = 512
MAX_CONSUMERS_PER_GROUP = 10_000
MAX_CONSUMER_NAMES = 100_000  # ~60 MB at the longest names
# ... of which the names one client (not an admin) made: one client creating fresh
# names, and keeping them used, took all 100,000 and refused every other client a new
# one. A tenth, as MAX_GROUPS_PER_CLIENT is of MAX_GROUPS: a full group's worth, or a
# fleet of 100 workers under one identity reading 100 groups each by its own name.
MAX_CONSUMER_NAMES_PER_CLIENT = 10_000

# Exactly-once sink (core/transactions.py): staged publishes live in memory only.
STAGED_TTL_S = 3600.0  # an orphan (a failed task's) expires this long after its last STAGE
MAX_STAGED_BYTES = 256 << 20  # everything staged, all writers together
MAX_STAGED_BYTES_PER_CLIENT = 128 << 20  # ... of which one client's (so no one takes all)
MAX_TXN_ID = 200  # characters of a transaction id, a writer id or a lineage (kept per writer)
MAX_WRITERS_PER_CLIENT = 1_000  # writer ids one client may own (each is kept for good)
# A commit's answer is kept for STAGED_TTL_S so a TXN_COMMIT sent again gets it again:
# one per committed transaction (~1.3 KB held), so without a bound a client committing
# small transactions fast held the broker's memory for an hour (3,000 commits/s: ~14 GB).
# Past these the oldest answers go first (a commit sent again for one of them is told
# "unknown transaction", as after the hour; fences still discard a replayed batch).
MAX_ANSWERS_PER_CLIENT = 10_000
MAX_ANSWERS = 100_000  # all clients together
# Idempotent producers: refused ranges remembered per (producer, channel), so a resend of
# a refused publish gets the same error; a few cover a run of refusals and retries.
MAX_REFUSED_RANGES = 8

# The dashboard's rate charts (server/rate_history.py): memory fixed at start, about
# (queues + 1) x 3 x seconds floats (~1.5 MB).
RATE_HISTORY_S = 600  # ten minutes at one sample a second: what the charts show
RATE_HISTORY_QUEUES = 100  # queues with a history of their own (the broker's is always kept)
# The rate samples (each queue's totals, once a second): the loop is let go once a walk
# has held it RATE_SAMPLE_SLICE_S, looked at every RATE_SAMPLE_LOOK channels; the next
# sample waits at least RATE_SAMPLE_SPACING times what the last one held the loop
# (at 100,000 queues a sample costs 60-120 ms: one every ~1-2 s, never over ~7 % of it).
RATE_SAMPLE_SLICE_S = 0.002
RATE_SAMPLE_LOOK = 256
RATE_SAMPLE_SPACING = 15.0
# A scrape's snapshot (/metrics, /statistics): channels or groups summed between two turns
# of the loop (~1-2 ms of it at 100,000 channels).
SNAPSHOT_LOOK = 1_000
# Queues (and reader groups) a scrape lists series of at most, by default
# (``metrics_max_queues``): each is ~8 series, and 100,000 queues made a 34 MB scrape that
# took its thread 3-4 s and is more than a Prometheus server wants from one target
# (docs/benchmarks.md). Past it the first ones by name are listed, the rest counted.
DEFAULT_METRICS_MAX_QUEUES = 10_000
