"""The Lua scripts behind the Redis store: every change to a session is one atomic script.

Keys of a session (``P`` is ``AGENT_REDIS_PREFIX``):

- ``P:s:<id>``      hash: owner, conversation, usage, status, the running query, ``last_id``,
  ``bytes`` (the log's kept size), ``tok`` (the last append's token, for safe retries), ``fin``
  (the claim of the last query that finished, so a retried finish is known); per tool approval
  ``ap:<approval id>`` its state (``p`` pending, ``1`` approved, ``0`` denied, ``e`` expired, ``x`` closed: its
  query ended unanswered) and, while pending, ``aq:<approval id>`` the request's JSON; ``apl``
  the running query's approval ids, space-separated, for closing them when it ends
- ``P:s:<id>:log``  stream: one entry per event with the id ``<n>-0`` (``n`` is the event's
  integer id), fields ``e`` (the event's JSON), ``t`` (when it was logged), ``n`` (its size as the byte
  bound counts it, the same as in memory);
  a last entry with the field ``c`` marks a deleted session
- ``P:s:<id>:run``  string: the claim of the running query (``<instance>:<run id>``), with an expiry
- ``P:sessions``    sorted set: session id -> when it expires (epoch ms), to count and cap sessions

Scripts return errors as bare words (``NOSESSION``, ``CLAIMED``, ``RUNLOST``, ``SESSIONLIMIT``), which the
store turns into the service's exceptions.
"""

from __future__ import annotations

# append(meta, log, json, ts, size, max_bytes) -> id: the next id, the entry, the byte bound kept
# by dropping the oldest entries (never the newest), and the log's expiry copied from the hash.
_APPEND = """
local function append(meta, logk, json, ts, size, max_bytes)
  local id = redis.call('HINCRBY', meta, 'last_id', 1)
  redis.call('XADD', logk, id .. '-0', 'e', json, 't', ts, 'n', size)
  local bytes = redis.call('HINCRBY', meta, 'bytes', size)
  if bytes > max_bytes then
    local start = '-'
    local cut = nil
    local done = false
    while not done do
      local batch = redis.call('XRANGE', logk, start, '+', 'COUNT', 128)
      if #batch == 0 then break end
      for _, entry in ipairs(batch) do
        local n = tonumber(string.match(entry[1], '^(%d+)'))
        if n >= id or bytes <= max_bytes then done = true; break end
        bytes = bytes - tonumber(entry[2][6])
        cut = n
      end
      start = '(' .. batch[#batch][1]
    end
    if cut then
      redis.call('XTRIM', logk, 'MINID', (cut + 1) .. '-0')
      redis.call('HSET', meta, 'bytes', bytes)
    end
  end
  if redis.call('PTTL', logk) == -1 then
    local ttl = redis.call('PTTL', meta)
    if ttl > 0 then redis.call('PEXPIRE', logk, ttl) end
  end
  return id
end

local function close_approvals(meta)
  local ids = redis.call('HGET', meta, 'apl')
  if not ids then return end
  for aid in string.gmatch(ids, '%S+') do
    if redis.call('HGET', meta, 'ap:' .. aid) == 'p' then redis.call('HSET', meta, 'ap:' .. aid, 'x') end
    redis.call('HDEL', meta, 'aq:' .. aid)
  end
  redis.call('HDEL', meta, 'apl')
end

local function active(meta)
  local status = redis.call('HGET', meta, 'status')
  return status == 'running' or status == 'waiting'
end

local function interrupt(meta, logk, max_bytes, ts, status_json, error_json)
  close_approvals(meta)
  append(meta, logk, status_json, ts, #status_json, max_bytes)
  append(meta, logk, error_json, ts, #error_json, max_bytes)
  redis.call('HSET', meta, 'status', 'idle', 'run_id', '', 'run_msg', '', 'run_start', 0)
end

local function refresh(meta, logk, zset, sid, ttl, now)
  redis.call('PEXPIRE', meta, ttl)
  if redis.call('EXISTS', logk) == 1 then redis.call('PEXPIRE', logk, ttl) end
  redis.call('ZADD', zset, now + ttl, sid)
end
"""

# KEYS meta, log, lock   ARGV fence, json, ts, size, max_bytes, token, then (json, size) for each
# further event -> the last id. One call stores a run's burst of events together (their ids follow
# one another); the token names the whole call, so a repeated one stores nothing twice and answers
# as the first did.
APPEND = (
    _APPEND
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOSESSION') end
if ARGV[1] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[1] then return redis.error_reply('RUNLOST') end
if ARGV[6] ~= '' and redis.call('HGET', KEYS[1], 'tok') == ARGV[6] then
  return tonumber(redis.call('HGET', KEYS[1], 'last_id'))
end
local max_bytes = tonumber(ARGV[5])
local id = append(KEYS[1], KEYS[2], ARGV[2], ARGV[3], tonumber(ARGV[4]), max_bytes)
for i = 7, #ARGV - 1, 2 do
  id = append(KEYS[1], KEYS[2], ARGV[i], ARGV[3], tonumber(ARGV[i + 1]), max_bytes)
end
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'tok', ARGV[6]) end
return id
"""
)

# KEYS meta, zset, owner_set   ARGV sid, owner, created, ttl_ms, now_ms, max_sessions, max_per_owner,
# meta_prefix, agent. The owner's set names its sessions; one whose meta key is gone (deleted, expired)
# is dropped from it here, so it needs no upkeep elsewhere.
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.error_reply('EXISTS') end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[6]) then return redis.error_reply('SESSIONLIMIT') end
local per_owner = tonumber(ARGV[7])
if per_owner > 0 then
  for _, sid in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    if redis.call('EXISTS', ARGV[8] .. sid) == 0 then redis.call('ZREM', KEYS[3], sid) end
  end
  if redis.call('ZCARD', KEYS[3]) >= per_owner then return redis.error_reply('OWNERLIMIT') end
  redis.call('ZADD', KEYS[3], tonumber(ARGV[5]), ARGV[1])
end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'created', ARGV[3], 'status', 'idle', 'messages', '[]',
  'usage', '{}', 'last_id', 0, 'bytes', 0, 'run_id', '', 'run_msg', '', 'run_start', 0, 'agent', ARGV[9])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[2], tonumber(ARGV[5]) + tonumber(ARGV[4]), ARGV[1])
return 1
"""

# KEYS meta, log, zset   ARGV sid, owner, created, ttl_ms, now_ms, messages, usage, last_id, agent
# Holds again a session loaded from the database, its log continuing after the stored last id;
# 0 when it is held already (another instance restored it first).
RESTORE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'created', ARGV[3], 'status', 'idle', 'messages', ARGV[6],
  'usage', ARGV[7], 'last_id', ARGV[8], 'bytes', 0, 'run_id', '', 'run_msg', '', 'run_start', 0,
  'agent', ARGV[9])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[3], tonumber(ARGV[5]) + tonumber(ARGV[4]), ARGV[1])
return 1
"""

# The interrupted-query check, shared by LOAD and REAP: a session that says "running" while
# nobody holds its claim was left by an instance that died; end that query with an error.
# ARGV from index `base`: max_bytes, ts, status_json, error_json
_REAP_IF_ORPHANED = """
local function reap(meta, logk, lockk, base)
  if not active(meta) then return 0 end
  if redis.call('EXISTS', lockk) == 1 then return 0 end
  interrupt(meta, logk, tonumber(ARGV[base]), ARGV[base + 1], ARGV[base + 2], ARGV[base + 3])
  return 1
end
"""

# KEYS meta, log, lock   ARGV max_bytes, ts, status_json, error_json  -> the hash, flat
LOAD = (
    _APPEND
    + _REAP_IF_ORPHANED
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOSESSION') end
reap(KEYS[1], KEYS[2], KEYS[3], 1)
return redis.call('HGETALL', KEYS[1])
"""
)

# KEYS meta, log, lock   ARGV max_bytes, ts, status_json, error_json, stale_fence
# Ends an orphaned query; with a stale fence, first drops that claim (its instance is gone).
REAP = (
    _APPEND
    + _REAP_IF_ORPHANED
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[5] ~= '' and redis.call('GET', KEYS[3]) == ARGV[5] then redis.call('DEL', KEYS[3]) end
return reap(KEYS[1], KEYS[2], KEYS[3], 1)
"""
)

# KEYS meta, log, lock, zset
# ARGV sid, fence, lock_ttl_ms, run_id, message, ttl_ms, now_ms, max_bytes, ts, status_json, error_json
# -> the conversation as it stands now (the run starts from it)
CLAIM = (
    _APPEND
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOSESSION') end
if not redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ARGV[3]) then return redis.error_reply('CLAIMED') end
if active(KEYS[1]) then
  interrupt(KEYS[1], KEYS[2], tonumber(ARGV[8]), ARGV[9], ARGV[10], ARGV[11])
end
local start = tonumber(redis.call('HGET', KEYS[1], 'last_id')) + 1
redis.call('HSET', KEYS[1], 'status', 'running', 'run_id', ARGV[4], 'run_msg', ARGV[5], 'run_start', start)
refresh(KEYS[1], KEYS[2], KEYS[4], ARGV[1], tonumber(ARGV[6]), tonumber(ARGV[7]))
return redis.call('HGET', KEYS[1], 'messages')
"""
)

# KEYS meta, log, lock, zset
# ARGV sid, fence, messages, usage, ttl_ms, now_ms, max_bytes, then (json, ts) per event
FINISH = (
    _APPEND
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('GET', KEYS[3]) ~= ARGV[2] then
  if redis.call('HGET', KEYS[1], 'fin') == ARGV[2] then return 1 end
  return redis.error_reply('RUNLOST')
end
close_approvals(KEYS[1])
redis.call('HSET', KEYS[1], 'messages', ARGV[3], 'usage', ARGV[4], 'status', 'idle',
  'run_id', '', 'run_msg', '', 'run_start', 0, 'fin', ARGV[2])
redis.call('DEL', KEYS[3])
local i = 8
while i < #ARGV do
  append(KEYS[1], KEYS[2], ARGV[i], ARGV[i + 1], #ARGV[i], tonumber(ARGV[7]))
  i = i + 2
end
refresh(KEYS[1], KEYS[2], KEYS[4], ARGV[1], tonumber(ARGV[5]), tonumber(ARGV[6]))
return 1
"""
)

# KEYS meta, log, lock   ARGV fence, status, ts, max_bytes, n, then (approval id, request json) n
# times, then (json, size) per event -> the last id. The running query's status (``waiting`` with
# the approvals it opens, ``running`` again once they are answered) and its events, in one step.
STATUS = (
    _APPEND
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOSESSION') end
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return redis.error_reply('RUNLOST') end
redis.call('HSET', KEYS[1], 'status', ARGV[2])
local n = tonumber(ARGV[5])
local i = 6
for _ = 1, n do
  redis.call('HSET', KEYS[1], 'ap:' .. ARGV[i], 'p', 'aq:' .. ARGV[i], ARGV[i + 1])
  local ids = redis.call('HGET', KEYS[1], 'apl')
  redis.call('HSET', KEYS[1], 'apl', (ids and (ids .. ' ') or '') .. ARGV[i])
  i = i + 2
end
local id = tonumber(redis.call('HGET', KEYS[1], 'last_id'))
while i < #ARGV do
  id = append(KEYS[1], KEYS[2], ARGV[i], ARGV[3], tonumber(ARGV[i + 1]), tonumber(ARGV[4]))
  i = i + 2
end
return id
"""
)

# KEYS meta, log   ARGV approval id, the state it leaves ('1', '0', 'e'), response json, ts, size, max_bytes
# -> 'ok' when this answer was taken (and logged), else the approval's state ('1', '0', 'e', 'x'), or
# '' for an id the session never had. Checked and logged in one step: answered once, anywhere.
ANSWER = (
    _APPEND
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOSESSION') end
local state = redis.call('HGET', KEYS[1], 'ap:' .. ARGV[1])
if not state then return '' end
if state ~= 'p' then return state end
redis.call('HSET', KEYS[1], 'ap:' .. ARGV[1], ARGV[2])
redis.call('HDEL', KEYS[1], 'aq:' .. ARGV[1])
append(KEYS[1], KEYS[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]))
return 'ok'
"""
)

# KEYS lock, meta, log, zset   ARGV sid, fence, lock_ttl_ms, ttl_ms, now_ms  -> 1 kept, 0 lost
RENEW = (
    _APPEND
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
refresh(KEYS[2], KEYS[3], KEYS[4], ARGV[1], tonumber(ARGV[4]), tonumber(ARGV[5]))
return 1
"""
)

# KEYS meta, log, lock, zset   ARGV sid, ts
# Forgets the session; the log keeps a closing mark for a minute so every reader sees the end.
DELETE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local id = tonumber(redis.call('HGET', KEYS[1], 'last_id')) + 1
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('XADD', KEYS[2], id .. '-0', 'c', '1', 't', ARGV[2])
redis.call('PEXPIRE', KEYS[2], 60000)
return 1
"""
