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
GC_THRESHOLD = 100_000  # allocations before a young-generation collection (default 700)
HELLO_TIMEOUT_S = 10.0

# Client
CLIENT_SEND_QUEUE = 100_000
# Publishes per frame: small enough that the broker commits the first frames of a
# burst while it still reads the rest (and confirms come back sooner), large enough
# to keep per-frame costs low.
CLIENT_FRAME_MESSAGES = 256  # messages waiting to be sent or confirmed
CLIENT_RECONNECT_MIN_S = 0.05
CLIENT_RECONNECT_MAX_S = 2.0
CLIENT_REQUEST_TIMEOUT_S = 30.0
