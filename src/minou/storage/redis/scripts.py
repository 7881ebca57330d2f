"""The Lua scripts: one writes a queue's part of a batch, one the shared part, the
rest read. Every key a script touches is built from ARGV[1], the base of one hash tag
(``<prefix>:{<queue>}:``), and KEYS[1] is a key under it: in Redis Cluster the script
is routed by KEYS[1] and stays in its slot.

Write scripts start with ``#!lua``: Redis 7 then refuses them as a whole when memory
is over ``maxmemory`` (before their first write), and a MULTI holding one is refused
at EXEC, so an out-of-memory batch writes nothing. The ``_OOM`` variants
(``flags=allow-oom``) run the batches that only settle (acks, group states,
removals) or register clients (bounded): those must get through while Redis is full, as
the SQLite reserve lets them through a full disk.
"""

from __future__ import annotations

# Byte accounting shared by both write scripts: ``used`` counts what the records take
# (their fields and values, plus 64 for each record), the quota's measure.
_LIB = r"""
local base = ARGV[1]
local used = 0
local function hput(key, field, value)
  local old = redis.call('HSTRLEN', key, field)
  if old > 0 then used = used - old else used = used + 64 + #field end
  redis.call('HSET', key, field, value)
  used = used + #value
end
local function hdel(key, field)
  local old = redis.call('HSTRLEN', key, field)
  if old > 0 then
    redis.call('HDEL', key, field)
    used = used - old - 64 - #field
  end
end
local function hdrop(key)
  local all = redis.call('HGETALL', key)
  for j = 1, #all, 2 do used = used - 64 - #all[j] - #all[j + 1] end
  redis.call('DEL', key)
end
local function dedup_put(field, expires, value)
  hput(base .. 'dedup', field, value)
  redis.call('ZADD', base .. 'dedupx', expires, field)
end
local function dedup_prune(cutoff)
  local old = redis.call('ZRANGEBYSCORE', base .. 'dedupx', '-inf', '(' .. cutoff,
                         'LIMIT', 0, 256)
  for _, f in ipairs(old) do
    hdel(base .. 'dedup', f)
    redis.call('ZREM', base .. 'dedupx', f)
  end
end
"""

_QUEUE_BODY = r"""
local epoch = redis.call('GET', KEYS[1]) or '0'
if epoch ~= ARGV[2] then return {'fenced', epoch} end

local function segment_drop(ch, first)
  local m = ch .. '\0' .. first
  hdel(base .. 'b:' .. ch, first)
  redis.call('HDEL', base .. 'm:' .. ch, first)
  redis.call('ZREM', base .. 's:' .. ch, first)
  redis.call('ZREM', base .. 'exp', m)
  redis.call('SREM', base .. 'spec', m)
end

local i, n = 3, #ARGV
while i <= n do
  local op = ARGV[i]
  if op == 'S' then
    local ch, first, last, pub, x = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4],
                                    ARGV[i + 5]
    local m = ch .. '\0' .. first
    hput(base .. 'b:' .. ch, first, ARGV[i + 6])
    redis.call('HSET', base .. 'm:' .. ch, first, last .. ' ' .. pub)
    redis.call('ZADD', base .. 's:' .. ch, first, first)
    if string.sub(x, 1, 1) == '!' then
      redis.call('SADD', base .. 'spec', m)
      x = string.sub(x, 2)
    else
      redis.call('SREM', base .. 'spec', m)
    end
    if x ~= '' then
      redis.call('ZADD', base .. 'exp', x, m)
    else
      redis.call('ZREM', base .. 'exp', m)
    end
    i = i + 7
  elseif op == 'C' then
    local ch, nxt = ARGV[i + 1], ARGV[i + 2]
    if redis.call('HSETNX', base .. 'next', ch, nxt) == 1 then
      redis.call('HSET', base .. 'born', ch, ARGV[i + 3])
      used = used + 64 + #ch
    elseif ARGV[i + 4] == '1' then
      if tonumber(nxt) > tonumber(redis.call('HGET', base .. 'next', ch)) then
        redis.call('HSET', base .. 'next', ch, nxt)
      end
    end
    i = i + 5
  elseif op == 'D' then
    if redis.call('ZADD', base .. 'r:' .. ARGV[i + 1], 'NX', ARGV[i + 2], ARGV[i + 2]) == 1 then
      used = used + 64
    end
    i = i + 3
  elseif op == 'T' then
    local ch, first = ARGV[i + 1], tonumber(ARGV[i + 2])
    if first > tonumber(redis.call('HGET', base .. 'first', ch) or '1') then
      redis.call('HSET', base .. 'first', ch, ARGV[i + 2])
    end
    -- A segment reaching the new first seq stays whole: the first seq hides its head.
    local below = redis.call('ZRANGEBYSCORE', base .. 's:' .. ch, '-inf', '(' .. first)
    for _, s in ipairs(below) do
      local meta = redis.call('HGET', base .. 'm:' .. ch, s)
      if tonumber(string.match(meta, '^(%d+)')) < first then segment_drop(ch, s) end
    end
    local r = base .. 'r:' .. ch
    local gone = redis.call('ZCOUNT', r, '-inf', '(' .. first)
    if gone > 0 then
      redis.call('ZREMRANGEBYSCORE', r, '-inf', '(' .. first)
      used = used - 64 * gone
    end
    i = i + 3
  elseif op == 'CX' then
    -- a channel removed whole (its messages truncated before): its record goes too
    local ch = ARGV[i + 1]
    if redis.call('HDEL', base .. 'next', ch) == 1 then used = used - 64 - #ch end
    redis.call('HDEL', base .. 'first', ch)
    redis.call('HDEL', base .. 'born', ch)
    for _, s in ipairs(redis.call('ZRANGE', base .. 's:' .. ch, 0, -1)) do
      segment_drop(ch, s)
    end
    local r = base .. 'r:' .. ch
    used = used - 64 * redis.call('ZCARD', r)
    redis.call('DEL', r, base .. 's:' .. ch, base .. 'm:' .. ch, base .. 'b:' .. ch)
    i = i + 2
  elseif op == 'GX' then
    hdrop(base .. 'gs:' .. ARGV[i + 1])
    redis.call('SREM', base .. 'groups', ARGV[i + 1])
    i = i + 2
  elseif op == 'G' then
    hput(base .. 'gs:' .. ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    redis.call('SADD', base .. 'groups', ARGV[i + 1])
    i = i + 4
  elseif op == 'GD' then
    local k = base .. 'gs:' .. ARGV[i + 1]
    hdel(k, ARGV[i + 2])
    if redis.call('HLEN', k) == 0 then redis.call('SREM', base .. 'groups', ARGV[i + 1]) end
    i = i + 3
  elseif op == 'X' then
    dedup_put(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    i = i + 4
  elseif op == 'XP' then
    dedup_prune(ARGV[i + 1])
    i = i + 2
  elseif op == 'I' then  -- a stream id a client gave (core/stream_ids.py), in its queue
    hput(base .. 'ids', ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  elseif op == 'ID' then
    hdel(base .. 'ids', ARGV[i + 1])
    i = i + 2
  elseif op == 'R' then
    hput(base .. 'prod', ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  elseif op == 'RD' then
    hdel(base .. 'prod', ARGV[i + 1])
    i = i + 2
  elseif op == 'FX' then
    hdrop(base .. 'fw:' .. ARGV[i + 1])
    redis.call('SREM', base .. 'fencers', ARGV[i + 1])
    i = i + 2
  elseif op == 'F' then
    hput(base .. 'fw:' .. ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    redis.call('SADD', base .. 'fencers', ARGV[i + 1])
    i = i + 4
  else
    return redis.error_reply('minou: unknown queue op ' .. tostring(op))
  end
end
return {'ok', redis.call('INCRBY', base .. 'used', used)}
"""

_SHARED_BODY = r"""
local i, n = 2, #ARGV
while i <= n do
  local op = ARGV[i]
  if op == 'P' then
    -- First, or not at all: only the broker holding the primary lease writes here.
    local holder = redis.call('GET', base .. 'primary') or ''
    if holder ~= ARGV[i + 1] then return {'fenced', holder} end
    i = i + 2
  elseif op == 'A' then
    -- Queues spread over brokers: only a broker still alive (its record in the alive
    -- set not run out, in Redis's clock) writes here; a paused one woken up does not.
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local score = redis.call('ZSCORE', base .. 'alive', ARGV[i + 1])
    if not score or tonumber(score) <= now then return {'fenced', ''} end
    i = i + 2
  elseif op == 'H' then
    hput(base .. ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    i = i + 4
  elseif op == 'HD' then
    hdel(base .. ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  elseif op == 'TK' then
    if redis.call('ZADD', base .. 'tokens', 'NX', ARGV[i + 2], ARGV[i + 1]) == 1 then
      used = used + 64 + #ARGV[i + 1]
    end
    i = i + 3
  elseif op == 'TP' then
    local old = redis.call('ZRANGEBYSCORE', base .. 'tokens', '-inf', '(' .. ARGV[i + 1],
                           'LIMIT', 0, 256)
    for _, jti in ipairs(old) do
      redis.call('ZREM', base .. 'tokens', jti)
      used = used - 64 - #jti
    end
    i = i + 2
  elseif op == 'ST' then
    hput(base .. 'txn:' .. ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    redis.call('SADD', base .. 'txns', ARGV[i + 1])
    i = i + 4
  elseif op == 'UT' then
    hdrop(base .. 'txn:' .. ARGV[i + 1])
    redis.call('SREM', base .. 'txns', ARGV[i + 1])
    i = i + 2
  elseif op == 'X' then
    dedup_put(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    i = i + 4
  elseif op == 'XP' then
    dedup_prune(ARGV[i + 1])
    i = i + 2
  else
    return redis.error_reply('minou: unknown shared op ' .. tostring(op))
  end
end
return {'ok', redis.call('INCRBY', base .. 'used', used)}
"""

# A queue is claimed (its epoch goes up, fencing every earlier writer) only by the
# broker holding the primary lease, checked in the same script, and entered in the
# registry of queues at once: a broker that takes over later finds it and claims it in
# turn, so a primary paused past its lease can write nothing to any queue, even one it
# made just before. KEYS[1]: the queue's epoch, KEYS[2]: the primary lease, KEYS[3]:
# the registry; ARGV[1]: this broker ('' : no lease to check), ARGV[2]: the queue.
# Three slots: one Redis only. Redis Cluster claims in two steps (below).
CLAIM = r"""
if ARGV[1] ~= '' then
  local holder = redis.call('GET', KEYS[2]) or ''
  if holder ~= ARGV[1] then return {'fenced', holder} end
end
redis.call('SADD', KEYS[3], ARGV[2])
return {'ok', redis.call('INCR', KEYS[1])}
"""

# Under Redis Cluster a script stays in one slot, so a claim is two: ADMIT, in the shared
# slot, checks the lease and enters the queues in the registry (as CLAIM does) and
# answers the lease's term (``term``: raised by every broker that takes the lease, see
# lease.py); CLAIM_TERM, in the queue's slot, raises its epoch unless a later term
# already claimed it. So a primary paused between the two steps, past its lease, cannot
# fence its successor's claim: its term is older. (Its successor finds the queue in the
# registry, claims it with the newer term, and fences it.)
# ADMIT: KEYS[1] the lease, KEYS[2] the registry, KEYS[3] the term; ARGV[1] this broker
# ('': no lease to check), ARGV[2...] the queues.
ADMIT = r"""
if ARGV[1] ~= '' then
  local holder = redis.call('GET', KEYS[1]) or ''
  if holder ~= ARGV[1] then return {'fenced', holder} end
end
for i = 2, #ARGV do redis.call('SADD', KEYS[2], ARGV[i]) end
return {'ok', redis.call('GET', KEYS[3]) or '0'}
"""
# CLAIM_TERM: KEYS[1] the queue's epoch, KEYS[2] the term that claimed it last; ARGV[1]
# the claiming lease's term.
CLAIM_TERM = r"""
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < last then return {'fenced', tostring(last)} end
redis.call('SET', KEYS[2], ARGV[1])
return {'ok', redis.call('INCR', KEYS[1])}
"""

QUEUE = "#!lua\n" + _LIB + _QUEUE_BODY
QUEUE_OOM = "#!lua flags=allow-oom\n" + _LIB + _QUEUE_BODY
SHARED = "#!lua\n" + _LIB + _SHARED_BODY
SHARED_OOM = "#!lua flags=allow-oom\n" + _LIB + _SHARED_BODY

# What open() reads of one queue in one reply: what is small and fixed (a field per
# channel, per group state, per producer, per fence):
# {used, next, first, born, {group, states}..., producers, {writer, fences}..., whole}
# The rest grows with the data: ``whole`` has it, {{channel, segment starts, their
# metas, removed seqs}..., special segments' bodies, dedup}, only when it is within
# ARGV[2] bytes of special segments and ARGV[3] entries (segments, removed seqs, spec
# members, dedup entries), as a small queue's is: else false, and the start reads it in
# pages (below, and HSCAN of ``dedup``), so that no reply, and no script, is as big as
# what the queue holds.
HEAD = r"""#!lua flags=no-writes
local base, most, entries = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
out[1] = redis.call('GET', base .. 'used') or '0'
out[2] = redis.call('HGETALL', base .. 'next')
out[3] = redis.call('HGETALL', base .. 'first')
out[4] = redis.call('HGETALL', base .. 'born')
local groups = {}
for _, g in ipairs(redis.call('SMEMBERS', base .. 'groups')) do
  groups[#groups + 1] = {g, redis.call('HGETALL', base .. 'gs:' .. g)}
end
out[5] = groups
out[6] = redis.call('HGETALL', base .. 'prod')
local fences = {}
for _, w in ipairs(redis.call('SMEMBERS', base .. 'fencers')) do
  fences[#fences + 1] = {w, redis.call('HGETALL', base .. 'fw:' .. w)}
end
out[7] = fences
out[8] = false
local n = redis.call('SCARD', base .. 'spec') + redis.call('HLEN', base .. 'dedup')
for j = 1, #out[2], 2 do
  if n > entries then return out end
  local ch = out[2][j]
  n = n + redis.call('ZCARD', base .. 's:' .. ch) + redis.call('ZCARD', base .. 'r:' .. ch)
end
if n > entries then return out end
local specials, size = redis.call('SMEMBERS', base .. 'spec'), 0
for _, m in ipairs(specials) do
  local ch, first = string.match(m, '^(.*)%z(%d+)$')
  size = size + redis.call('HSTRLEN', base .. 'b:' .. ch, first)
end
if size > most then return out end
local chans, bodies = {}, {}
for j = 1, #out[2], 2 do
  local ch = out[2][j]
  local starts = redis.call('ZRANGE', base .. 's:' .. ch, 0, -1)
  local metas = {}
  if #starts > 0 then metas = redis.call('HMGET', base .. 'm:' .. ch, unpack(starts)) end
  chans[#chans + 1] = {ch, starts, metas, redis.call('ZRANGE', base .. 'r:' .. ch, 0, -1)}
end
for _, m in ipairs(specials) do
  local ch, first = string.match(m, '^(.*)%z(%d+)$')
  local body = redis.call('HGET', base .. 'b:' .. ch, first)
  if body then bodies[#bodies + 1] = body end
end
out[8] = {chans, bodies, redis.call('HGETALL', base .. 'dedup')}
return out
"""

# A page of one kind of sorted set over channels ARGV[5...] in turn, at most ARGV[3]
# entries in all: ARGV[2] 's' (segments: their first seqs and their ``m:`` metas,
# "last published_at") or 'r' (removed seqs); ARGV[4] where the first channel goes on
# from (a ZRANGEBYSCORE min: '-inf', or '(' and the last entry had). One {entries,
# metas} per channel read; the last one read may have more when the page is full.
# (ARGV[3] stays under a few thousand: HMGET takes the page as arguments, unpack's.)
PAGE = r"""#!lua flags=no-writes
local base, kind, most, from = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local out, n = {}, 0
for j = 5, #ARGV do
  local ch = ARGV[j]
  local page = redis.call('ZRANGEBYSCORE', base .. kind .. ':' .. ch, from, '+inf',
                          'LIMIT', 0, most - n)
  local metas = {}
  if kind == 's' and #page > 0 then
    metas = redis.call('HMGET', base .. 'm:' .. ch, unpack(page))
  end
  out[#out + 1] = {page, metas}
  n = n + #page
  from = '-inf'
  if n >= most then break end
end
return out
"""

# Bodies of the queue's special segments (priority or delayed messages: the ``spec``
# set), about ARGV[3] bytes or ARGV[4] segments a call: SSCAN from cursor ARGV[2] ('-':
# the scan is over, only the members left over are to read), first the members
# ARGV[5...] a call before left over. {cursor ('-' once the scan is over), bodies,
# members left over}: each call sends at most one segment past ARGV[3] bytes, and
# leaves over at most one SSCAN batch of members.
SPECIALS = r"""#!lua flags=no-writes
local base, cursor, most, count = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local bodies, left, size, taken = {}, {}, 0, 0
local function take(m)
  if size >= most or taken >= count then
    left[#left + 1] = m
    return
  end
  taken = taken + 1
  local ch, first = string.match(m, '^(.*)%z(%d+)$')
  local body = redis.call('HGET', base .. 'b:' .. ch, first)
  if body then
    bodies[#bodies + 1] = body
    size = size + #body
  end
end
for j = 5, #ARGV do take(ARGV[j]) end
while cursor ~= '-' and size < most and taken < count do
  local r = redis.call('SSCAN', base .. 'spec', cursor, 'COUNT', 64)
  cursor = r[1]
  if cursor == '0' then cursor = '-' end
  for _, m in ipairs(r[2]) do take(m) end
end
return {cursor, bodies, left}
"""

# Segments of one channel for seqs [lo, hi): {first seq, bodies from the segment holding
# lo on, removed seqs in the range, whether segments were left out}. Stops once the
# segments sent hold ``limit`` seqs of the range.
READ = r"""#!lua flags=no-writes
local base, ch = ARGV[1], ARGV[2]
local lo, hi, limit = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local most = tonumber(ARGV[6] or '0')  -- bytes of segment bodies (0: no limit)
local first = tonumber(redis.call('HGET', base .. 'first', ch) or '1')
if lo < first then lo = first end
if lo < 0 then lo = 0 end
if lo >= hi then return {first, {}, {}, 0} end
local s = base .. 's:' .. ch
local from = redis.call('ZREVRANGEBYSCORE', s, lo, '-inf', 'LIMIT', 0, 1)[1] or lo
local starts = redis.call('ZRANGEBYSCORE', s, from, '(' .. hi)
local bodies, count, more, size = {}, 0, 0, 0
for j, st in ipairs(starts) do
  if count >= limit or (most > 0 and size >= most) then more = 1 break end
  local body = redis.call('HGET', base .. 'b:' .. ch, st)
  bodies[#bodies + 1] = body
  local last = tonumber(string.match(redis.call('HGET', base .. 'm:' .. ch, st), '^(%d+)'))
  local a, b = math.max(tonumber(st), lo), math.min(last, hi - 1)
  if b >= a then  -- only segments with seqs in range count (the first may end below lo)
    count = count + b - a + 1
    if body then size = size + #body end
  end
end
local removed = redis.call('ZRANGEBYSCORE', base .. 'r:' .. ch, lo, '(' .. hi)
return {first, bodies, removed, more}
"""

# The segment starting at or after ARGV[3] and before ARGV[4]: {first, published_at}.
FIRST_AT_OR_AFTER = r"""#!lua flags=no-writes
local base, ch = ARGV[1], ARGV[2]
local s = redis.call('ZRANGEBYSCORE', base .. 's:' .. ch, ARGV[3], '(' .. ARGV[4],
                     'LIMIT', 0, 1)[1]
if not s then return {} end
return {s, redis.call('HGET', base .. 'm:' .. ch, s)}
"""

# Segments named in ARGV[2..]: {body, channel's first seq, removed seqs} each.
SEGMENTS = r"""#!lua flags=no-writes
local base = ARGV[1]
local out = {}
for j = 2, #ARGV do
  local ch, first = string.match(ARGV[j], '^(.*)%z(%d+)$')
  local body = redis.call('HGET', base .. 'b:' .. ch, first)
  if body then
    local meta = redis.call('HGET', base .. 'm:' .. ch, first)
    local last = string.match(meta, '^(%d+)')
    out[#out + 1] = {ARGV[j], body, redis.call('HGET', base .. 'first', ch) or '1',
                     redis.call('ZRANGEBYSCORE', base .. 'r:' .. ch, first, last)}
  end
end
return out
"""

# Queues spread over brokers. A live broker claims a queue that no live broker owns
# (its owner died, handed it over, or it is new): the owners hash names it, the registry
# has it, and a counter goes up. One Redis: the counter is the queue's epoch (fencing
# every earlier writer). Redis Cluster, where the queue's keys are in another slot: the
# counter is one term for every claim, and CLAIM_TERM then raises the queue's epoch in
# its own slot unless a later term claimed it, so a broker paused between the two steps,
# whose claim another took over meanwhile, raises nothing.
# KEYS[1] the owners hash, KEYS[2] the alive set, KEYS[3] the registry, KEYS[4] the
# counter; ARGV[1] this broker, ARGV[2] the queue. {'ok', counter}; {'owned', owner}
# while another live broker owns it, {'dead', ''} if this broker's own record ran out
# (it was paused).
OWN = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mine = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not mine or tonumber(mine) <= now then return {'dead', ''} end
local owner = redis.call('HGET', KEYS[1], ARGV[2])
if owner and owner ~= ARGV[1] then
  local score = redis.call('ZSCORE', KEYS[2], owner)
  if score and tonumber(score) > now then return {'owned', owner} end
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[2])
return {'ok', redis.call('INCR', KEYS[4])}
"""
# Hand a queue over: the next live broker may claim it at once. KEYS[1] the owners hash;
# ARGV[1] this broker, ARGV[2] the queue. 1 if it was this broker's.
DISOWN = r"""
if redis.call('HGET', KEYS[1], ARGV[2]) ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[2])
return 1
"""

# Bind a Spark writer id to the client committing under it first, on every broker at once
# (queues spread over brokers: each holds the writers in memory, and a broker that never
# held a part of a writer's commits would otherwise bind the id to whoever came first
# there). Counted in ``used`` as the shared script counts a record. KEYS[1] the shared
# ``used`` (its slot); ARGV[1] the shared base, ARGV[2] the writer id, ARGV[3] the
# client. The client the id belongs to now.
BIND_WRITER = r"""#!lua flags=allow-oom
local w = ARGV[1] .. 'writers'
if redis.call('HSETNX', w, ARGV[2], ARGV[3]) == 1 then
  redis.call('INCRBY', KEYS[1], 64 + #ARGV[2] + #ARGV[3])
end
return redis.call('HGET', w, ARGV[2])
"""

# A native HELLO's token id, claimed before the WELCOME (queues spread over brokers:
# each broker remembers the ids it saw, so a token used on one would open a connection
# on each of the others). Counted in ``used`` as the shared script's TK counts it (that
# TK, from the commit that follows, then finds it there). KEYS[1] the shared ``used``;
# ARGV[1] the shared base, ARGV[2] the id, ARGV[3] its expiry. 1: claimed here, 0: used.
CLAIM_TOKEN = r"""#!lua flags=allow-oom
if redis.call('ZADD', ARGV[1] .. 'tokens', 'NX', ARGV[3], ARGV[2]) == 1 then
  redis.call('INCRBY', KEYS[1], 64 + #ARGV[2])
  return 1
end
return 0
"""

WRITE_SCRIPTS = {"queue": QUEUE, "queue_oom": QUEUE_OOM, "shared": SHARED,
                 "shared_oom": SHARED_OOM, "claim": CLAIM, "own": OWN, "disown": DISOWN,
                 "admit": ADMIT, "claim_term": CLAIM_TERM,
                 "bind_writer": BIND_WRITER, "claim_token": CLAIM_TOKEN}
READ_SCRIPTS = {"head": HEAD, "page": PAGE, "specials": SPECIALS, "read": READ,
                "first_at_or_after": FIRST_AT_OR_AFTER, "segments": SEGMENTS}
