"""Lua scripts of :mod:`proxy.backends.redis.queue` (sources only, no I/O).

Each script runs atomically on one hash slot and touches only the keys it is given:

- **job scripts** get the six job keys of the queue, in this order::

      KEYS = [ready (STREAM), jobs (HASH), payloads (HASH), delayed (ZSET),
              leased (ZSET), dead (ZSET), flushes (STREAM)]

  and RETRY and RESUME_POSTPONED an eighth, ``postponed`` (SET): the tenants with jobs a
  spent learning budget put off (read by ``postponed_tenants``).

  A job's header in ``jobs`` is JSON ``{kind, attempts, state, created, available,
  updated, error, entry, by, tenant, stream}`` (``tenant`` absent on jobs queued before it
  was kept, ``''`` for a job of no tenant; ``stream`` ``'f'`` when its entry is in the
  ``flushes`` stream, absent or ``''`` for ``ready``). A ``flush`` job's entry goes to
  ``flushes``, every other kind's to ``ready``; a claim reads ``ready`` first, so idle
  flushes wait until no exchange or learn job does. ``state`` is ``ready`` (an undelivered
  stream entry),
  ``leased`` (a pending entry of the group, and a member of ``leased``), ``delayed``
  (a member of ``delayed``, no stream entry) or ``dead`` (a member of ``dead``). Times are
  the Redis server's clock (``TIME``), epoch seconds, kept as ``%.17g`` strings.
- **buffer scripts** get one user's keys (all tagged with the user's namespace token).
  A conversation's buffer is one HASH: ``tenant``, ``user``, ``conversation``, ``order``
  (one line ``<role> <at> <fingerprint>`` per unsealed message, oldest first), ``users``
  and ``count`` (unsealed user / all messages), ``first`` and ``last`` (oldest and newest
  ``at``, as given) and ``m:<fingerprint>`` → the message's JSON. A sealed batch is the
  same shape without the counters.
"""

from __future__ import annotations

GROUP = "workers"  # the one consumer group of the ready stream

_JOB_PRELUDE = """
local GROUP = 'workers'
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function fmt(x) return string.format('%.17g', x) end
local STREAMS = {KEYS[1], KEYS[7]}
local function ensure_group()
  for _, key in ipairs(STREAMS) do
    if redis.call('EXISTS', key) == 0 then
      redis.call('XGROUP', 'CREATE', key, GROUP, '0', 'MKSTREAM')
    end
  end
end
-- The stream holding a job's entry (headers written before flushes had their own
-- stream name none: theirs is `ready`).
local function stream_of(h)
  if h.stream == 'f' then return KEYS[7] end
  return KEYS[1]
end
-- Take a job's entry off its stream: acknowledged (out of the pending list) and deleted.
local function unlist(h)
  if h.entry ~= nil and h.entry ~= '' then
    redis.call('XACK', stream_of(h), GROUP, h.entry)
    redis.call('XDEL', stream_of(h), h.entry)
  end
  h.entry = ''
end
local function save(id, h) redis.call('HSET', KEYS[2], id, cjson.encode(h)) end
-- Append the job to its kind's stream: `flushes` for a flush, `ready` for the others.
local function make_ready(id, h, now)
  if h.kind == 'flush' then h.stream = 'f' else h.stream = '' end
  h.entry = redis.call('XADD', stream_of(h), '*', 'id', id)
  h.state = 'ready'
  h.by = ''
  h.updated = fmt(now)
  save(id, h)
end
local function header(id)
  local raw = redis.call('HGET', KEYS[2], id)
  if not raw then return nil end
  return cjson.decode(raw)
end
"""

# ARGV = (kind, id, payload, tenant)*; tenant '' = none. Jobs whose id is present (in any
# state) are ignored. Returns how many were added.
ENQUEUE = _JOB_PRELUDE + """
ensure_group()
local now = clock()
local at = fmt(now)
local added = 0
for i = 1, #ARGV, 4 do
  local id = ARGV[i + 1]
  if redis.call('HEXISTS', KEYS[2], id) == 0 then
    make_ready(id, {kind = ARGV[i], attempts = 0, created = at, available = at,
                    error = '', tenant = ARGV[i + 3]}, now)
    redis.call('HSET', KEYS[3], id, ARGV[i + 2])
    added = added + 1
  end
end
return added
"""

# ARGV = (consumer, lease seconds, how many due delayed jobs to promote at most).
# 1. due delayed jobs are appended to the stream (several workers may run this at once:
#    the script is atomic, so each is promoted once);
# 2. a job whose lease ran out is claimed from its holder (XCLAIM ... FORCE: the pending
#    entry moves to this consumer, and is recreated if the holder was pruned);
# 3. else the oldest undelivered entry (XREADGROUP '>') of `ready`, then of `flushes`.
# The attempt count lives in the header and grows by one per delivery.
# Returns false or {id, kind, payload, attempts}.
CLAIM = _JOB_PRELUDE + """
ensure_group()
local consumer = ARGV[1]
local lease = tonumber(ARGV[2])
local now = clock()
local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[4], id)
  local h = header(id)
  if h then make_ready(id, h, now) end
end
local function grant(id, h, entry)
  h.entry = entry
  h.state = 'leased'
  h.attempts = h.attempts + 1
  h.by = consumer
  h.updated = fmt(now)
  save(id, h)
  redis.call('ZADD', KEYS[5], now + lease, id)
  return {id, h.kind, redis.call('HGET', KEYS[3], id) or '', h.attempts}
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 1)[1]
if expired then
  local h = header(expired)
  if not h then
    redis.call('ZREM', KEYS[5], expired)
  else
    local claimed = {}
    if h.entry ~= '' then
      claimed = redis.call('XCLAIM', stream_of(h), GROUP, consumer, 0, h.entry, 'FORCE',
                           'JUSTID')
    end
    if claimed[1] then return grant(expired, h, claimed[1]) end
    -- its entry left the stream (never expected): the job becomes ready again
    redis.call('ZREM', KEYS[5], expired)
    make_ready(expired, h, now)
  end
end
local function next_of(stream)
  for _ = 1, 32 do
    local got = redis.call('XREADGROUP', 'GROUP', GROUP, consumer, 'COUNT', 1,
                           'STREAMS', stream, '>')
    if not got then return nil end
    local entry = got[1][2][1][1]
    local id = got[1][2][1][2][2]
    local h = header(id)
    if h and h.entry == entry and stream_of(h) == stream then return grant(id, h, entry) end
    -- a stale entry (its job was acknowledged or moved): drop it
    redis.call('XACK', stream, GROUP, entry)
    redis.call('XDEL', stream, entry)
  end
  return nil
end
return next_of(KEYS[1]) or next_of(KEYS[7]) or false
"""

# ARGV = (id). Deletes the job in whatever state it is. Returns 1, or 0 when unknown.
ACK = _JOB_PRELUDE + """
local id = ARGV[1]
local h = header(id)
if not h then return 0 end
unlist(h)
redis.call('HDEL', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
redis.call('ZREM', KEYS[4], id)
redis.call('ZREM', KEYS[5], id)
redis.call('ZREM', KEYS[6], id)
return 1
"""

# ARGV = (id, error, delay seconds[, refund]). The attempt count is kept — or, with
# refund '1' (a job postponed by a spent learning budget), this delivery is given back and
# the job's tenant is added to KEYS[8], the set of tenants with postponed jobs (given with
# the refund only). Returns 1, or 0.
RETRY = _JOB_PRELUDE + """
local id = ARGV[1]
local delay = tonumber(ARGV[3])
local h = header(id)
if not h then return 0 end
local now = clock()
unlist(h)
redis.call('ZREM', KEYS[5], id)
redis.call('ZREM', KEYS[6], id)
h.error = ARGV[2]
if ARGV[4] == '1' and h.attempts > 0 then h.attempts = h.attempts - 1 end
if ARGV[4] == '1' then h.budget = '1' else h.budget = nil end
h.available = fmt(now + delay)
if delay <= 0 then
  redis.call('ZREM', KEYS[4], id)
  make_ready(id, h, now)
else
  h.state = 'delayed'
  h.by = ''
  h.updated = fmt(now)
  save(id, h)
  redis.call('ZADD', KEYS[4], now + delay, id)
  if ARGV[4] == '1' and h.tenant and h.tenant ~= '' then
    redis.call('SADD', KEYS[8], h.tenant)
  end
end
return 1
"""

# ARGV = (tenant). Every delayed job of the tenant that a spent budget put off (header
# ``budget`` '1', set by RETRY with refund) is made ready now, and the tenant leaves
# KEYS[8] (the set of tenants with postponed jobs: it has none left). Reads the whole
# delayed set: run only when a tenant's budget was lifted or raised. Returns how many.
RESUME_POSTPONED = _JOB_PRELUDE + """
local now = clock()
local resumed = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  local h = header(id)
  if h and h.budget == '1' and h.tenant == ARGV[1] then
    redis.call('ZREM', KEYS[4], id)
    h.budget = nil
    h.available = fmt(now)
    make_ready(id, h, now)
    resumed = resumed + 1
  end
end
redis.call('SREM', KEYS[8], ARGV[1])
return resumed
"""

# ARGV = (id, error). Returns 1, or 0.
BURY = _JOB_PRELUDE + """
local id = ARGV[1]
local h = header(id)
if not h then return 0 end
local now = clock()
unlist(h)
redis.call('ZREM', KEYS[4], id)
redis.call('ZREM', KEYS[5], id)
h.state = 'dead'
h.by = ''
h.error = ARGV[2]
h.updated = fmt(now)
save(id, h)
redis.call('ZADD', KEYS[6], now, id)
return 1
"""

# A dead job of the tenant named by ARGV[2]: '=' + tenant, or '' for any tenant (the
# operator's CLI). Jobs queued before jobs carried a tenant have none and match only ''.
_DEAD_OF = """
local function dead_of(id, scope)
  local h = header(id)
  if not h or h.state ~= 'dead' then return nil end
  if scope ~= '' and (h.tenant == nil or h.tenant == '' or
                      '=' .. h.tenant ~= scope) then return nil end
  return h
end
"""

# ARGV = (id, scope). A dead job becomes ready with no attempts. Returns 1, or 0 if not
# a dead job (of the tenant).
REQUEUE = _JOB_PRELUDE + _DEAD_OF + """
local id = ARGV[1]
local h = dead_of(id, ARGV[2])
if not h then return 0 end
ensure_group()
local now = clock()
redis.call('ZREM', KEYS[6], id)
h.attempts = 0
h.available = fmt(now)
make_ready(id, h, now)
return 1
"""

# ARGV = (id, scope). Deletes a dead job (of the tenant). Returns 1, or 0.
DROP = _JOB_PRELUDE + _DEAD_OF + """
local id = ARGV[1]
if not dead_of(id, ARGV[2]) then return 0 end
redis.call('HDEL', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
redis.call('ZREM', KEYS[6], id)
return 1
"""

# KEYS = job keys + (buffered counter). Returns {ready, delayed, leased, dead, buffered}:
# ready = undelivered entries of both streams + delayed jobs already due (SQLite counts
# those as ready).
DEPTH = _JOB_PRELUDE + """
local now = clock()
local undelivered = 0
for _, stream in ipairs(STREAMS) do
  if redis.call('EXISTS', stream) == 1 then
    local pending = redis.pcall('XPENDING', stream, GROUP)
    local held = 0
    if type(pending) == 'table' and pending[1] then held = pending[1] end
    undelivered = undelivered + redis.call('XLEN', stream) - held
  end
end
local due = redis.call('ZCOUNT', KEYS[4], '-inf', now)
local buffered = tonumber(redis.call('GET', KEYS[8]) or '0')
return {undelivered + due, redis.call('ZCARD', KEYS[4]) - due, redis.call('ZCARD', KEYS[5]),
        redis.call('ZCARD', KEYS[6]), buffered}
"""

# ARGV = (idle milliseconds). Deletes consumers of the group that hold nothing and have
# not read for that long (each worker process is one consumer; restarts leave old ones).
PRUNE_CONSUMERS = _JOB_PRELUDE + """
local removed = 0
for _, stream in ipairs(STREAMS) do
  if redis.call('EXISTS', stream) == 1 then
    for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', stream, GROUP)) do
      local info = {}
      for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
      if info['pending'] == 0 and info['idle'] >= tonumber(ARGV[1]) then
        redis.call('XGROUP', 'DELCONSUMER', stream, GROUP, info['name'])
        removed = removed + 1
      end
    end
  end
end
return removed
"""

_BUFFER_PRELUDE = """
-- oldest and newest `at` of an order text, as written
local function bounds(order)
  local first, last, lo, hi
  for entry in string.gmatch(order, '[^\\n]+') do
    local at = string.match(entry, '^%S+ (%S+) ')
    local n = tonumber(at)
    if lo == nil or n < lo then lo, first = n, at end
    if hi == nil or n > hi then hi, last = n, at end
  end
  return first, last
end
"""

# KEYS = (seen ZSET, buffer HASH, the user's buffered-conversations SET)
# ARGV = (seen_at, batch size, tenant, user, conversation, at, retry window seconds,
#         (fingerprint, role, json, request key or '', '1' when new or '',
#          space-separated alias fingerprints or '')*)
# Messages whose fingerprint (or an alias: a fingerprint from before a key rotation or
# before keying) the user has seen are dropped; the others are recorded as
# seen (with their request key, if any) and appended. The request's new user message is
# appended unless its request key was seen within the retry window (a retried request, or
# a later request that carried it as history first) or is still buffered; it is buffered
# under its request key (a repeated text is a new message) and its fingerprint is
# recorded as seen (so it is skipped when resent as history).
# Returns {added, first, last, oldest seen} — the buffer's oldest and newest `at` ('' when
# it is empty) and the user's oldest fingerprint time ('' when none), for the caller to
# index even when nothing was added (a redelivered exchange repairs the indexes of a
# worker that died before writing them) — plus the whole order text when messages were
# added and the buffer now holds at least `batch size` user messages.
BUFFER = _BUFFER_PRELUDE + """
local batch = tonumber(ARGV[2])
local at = ARGV[6]
local since = tonumber(ARGV[1]) - tonumber(ARGV[7])
local added, users = {}, 0
local function seen_alias(aliases)
  for alias in string.gmatch(aliases, '%S+') do
    if redis.call('ZSCORE', KEYS[1], alias) then return true end
  end
  return false
end
for i = 8, #ARGV, 6 do
  local fp, role, rq = ARGV[i], ARGV[i + 1], ARGV[i + 3]
  local id = nil
  if rq ~= '' and ARGV[i + 4] == '1' then
    local last = redis.call('ZSCORE', KEYS[1], rq)
    if (not last or tonumber(last) <= since)
        and redis.call('HEXISTS', KEYS[2], 'm:' .. rq) == 0 then
      redis.call('ZADD', KEYS[1], ARGV[1], rq)
      redis.call('ZADD', KEYS[1], 'NX', ARGV[1], fp)
      id = rq
    end
  elseif redis.call('ZADD', KEYS[1], 'NX', ARGV[1], fp) == 1
      and not seen_alias(ARGV[i + 5]) then
    id = fp
    if rq ~= '' then redis.call('ZADD', KEYS[1], 'NX', ARGV[1], rq) end
  end
  if id then
    redis.call('HSET', KEYS[2], 'm:' .. id, ARGV[i + 2])
    added[#added + 1] = role .. ' ' .. at .. ' ' .. id
    if role == 'user' then users = users + 1 end
  end
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2] or ''
if #added == 0 then
  local bounds_now = redis.call('HMGET', KEYS[2], 'first', 'last')
  return {0, bounds_now[1] or '', bounds_now[2] or '', oldest}
end
local order = redis.call('HGET', KEYS[2], 'order')
local text = table.concat(added, '\\n')
if order and order ~= '' then text = order .. '\\n' .. text end
local first, last = bounds(text)
redis.call('HSET', KEYS[2], 'tenant', ARGV[3], 'user', ARGV[4], 'conversation', ARGV[5],
           'order', text, 'first', first, 'last', last)
local pending = redis.call('HINCRBY', KEYS[2], 'users', users)
redis.call('HINCRBY', KEYS[2], 'count', #added)
redis.call('SADD', KEYS[3], ARGV[5])
if pending >= batch then return {#added, first, last, oldest, text} end
return {#added, first, last, oldest}
"""

# KEYS = (buffer HASH, batch HASH, buffered-conversations SET, sealed SET, outbox SET)
# ARGV = (batch key, batch digest, expected order text)
# Seals the messages of `expected` when they are the buffer's oldest (the buffer may have
# grown since the caller read it: later messages stay buffered). The batch, its place in
# the user's sealed set and its key in the outbox are written together. Returns {1, n
# messages sealed}, or {0, current order text} when `expected` is not the buffer's head.
SEAL = _BUFFER_PRELUDE + """
local order = redis.call('HGET', KEYS[1], 'order')
local expected = ARGV[3]
if not order or order == '' then return {0, ''} end
local rest
if order == expected then
  rest = ''
elseif string.sub(order, 1, #expected + 1) == expected .. '\\n' then
  rest = string.sub(order, #expected + 2)
else
  return {0, order}
end
local moved, users = 0, 0
for entry in string.gmatch(expected, '[^\\n]+') do
  local role, fp = string.match(entry, '^(%S+) %S+ (.*)$')
  local field = 'm:' .. fp
  local body = redis.call('HGET', KEYS[1], field)
  if body then redis.call('HSET', KEYS[2], field, body) end
  redis.call('HDEL', KEYS[1], field)
  moved = moved + 1
  if role == 'user' then users = users + 1 end
end
local meta = redis.call('HMGET', KEYS[1], 'tenant', 'user', 'conversation')
redis.call('HSET', KEYS[2], 'tenant', meta[1], 'user', meta[2], 'conversation', meta[3],
           'order', expected)
redis.call('SADD', KEYS[4], ARGV[2])
redis.call('SADD', KEYS[5], ARGV[1])
if rest == '' then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[3], meta[3])
else
  local first, last = bounds(rest)
  redis.call('HSET', KEYS[1], 'order', rest, 'first', first, 'last', last)
  redis.call('HINCRBY', KEYS[1], 'users', -users)
  redis.call('HINCRBY', KEYS[1], 'count', -moved)
end
return {1, moved}
"""

# KEYS = (buffer HASH, buffered-conversations SET); ARGV = (cutoff epoch seconds)
# Deletes the unsealed messages with `at` < cutoff. Returns how many went.
EXPIRE_BUFFER = _BUFFER_PRELUDE + """
local order = redis.call('HGET', KEYS[1], 'order')
if not order or order == '' then return 0 end
local cutoff = tonumber(ARGV[1])
local keep, removed, users = {}, 0, 0
for entry in string.gmatch(order, '[^\\n]+') do
  local role, at, fp = string.match(entry, '^(%S+) (%S+) (.*)$')
  if tonumber(at) < cutoff then
    redis.call('HDEL', KEYS[1], 'm:' .. fp)
    removed = removed + 1
    if role == 'user' then users = users + 1 end
  else
    keep[#keep + 1] = entry
  end
end
if removed == 0 then return 0 end
if #keep == 0 then
  local conversation = redis.call('HGET', KEYS[1], 'conversation')
  redis.call('DEL', KEYS[1])
  if conversation then redis.call('SREM', KEYS[2], conversation) end
else
  local rest = table.concat(keep, '\\n')
  local first, last = bounds(rest)
  redis.call('HSET', KEYS[1], 'order', rest, 'first', first, 'last', last)
  redis.call('HINCRBY', KEYS[1], 'users', -users)
  redis.call('HINCRBY', KEYS[1], 'count', -removed)
end
return removed
"""

# ARGV = (id, attempts). Gives a leased job back at once (graceful shutdown): its entry
# leaves the pending list, the job is appended to the stream as ready and the attempt this
# delivery counted is taken back. Only the delivery named by ``attempts`` is released (a
# job redelivered to another worker since has a higher count). Returns 1, or 0.
RELEASE = _JOB_PRELUDE + """
local id = ARGV[1]
local h = header(id)
if not h or h.state ~= 'leased' or tonumber(h.attempts) ~= tonumber(ARGV[2]) then
  return 0
end
ensure_group()
local now = clock()
unlist(h)
redis.call('ZREM', KEYS[5], id)
h.attempts = math.max(0, h.attempts - 1)
h.available = fmt(now)
make_ready(id, h, now)
return 1
"""

# Returns the age in seconds (a string, %.17g) of the oldest job waiting for a worker —
# the first undelivered entry of either stream (its id is its XADD time in ms) or the
# earliest due delayed job — or false when none waits.
OLDEST = _JOB_PRELUDE + """
local now = clock()
local oldest = nil
for _, stream in ipairs(STREAMS) do
  if redis.call('EXISTS', stream) == 1 then
    local last = '0-0'
    local groups = redis.call('XINFO', 'GROUPS', stream)
    for _, g in ipairs(groups) do
      for i = 1, #g, 2 do
        if g[i] == 'name' and g[i + 1] ~= GROUP then break end
        if g[i] == 'last-delivered-id' then last = g[i + 1] end
      end
    end
    local first = redis.call('XRANGE', stream, '(' .. last, '+', 'COUNT', 1)[1]
    if first then
      local at = tonumber(string.match(first[1], '^(%d+)')) / 1000
      if oldest == nil or at < oldest then oldest = at end
    end
  end
end
local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
if due[2] then
  local at = tonumber(due[2])
  if oldest == nil or at < oldest then oldest = at end
end
if oldest == nil then return false end
return fmt(math.max(0, now - oldest))
"""
