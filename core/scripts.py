"""Lua scripts that make each job transition atomic on the Redis server.

Atomicity is what gives "exactly one terminal event per job": the check of the current
state and the write of the terminal state, result and event happen in one step, so a
cancel racing a finishing worker (or a zombie attempt) can never add a second one.

Event payloads arrive pre-serialised from Python as ``"type": ...`` JSON *bodies* (an
object without its opening brace); the script prefixes the sequence number it allocates.
"""
from core.keys import QUEUED_BY_OWNER

# Shared by every script: allocate seq, append to the stream, publish live.
_APPEND = """
local function append(job, events, channel, etype, attempt, ts, data, body, ttl)
  local seq = redis.call('HINCRBY', job, 'last_seq', 1)
  redis.call('XADD', events, '0-' .. seq, 'seq', seq, 'type', etype, 'attempt', attempt,
             'ts', ts, 'data', data)
  redis.call('EXPIRE', events, ttl)
  redis.call('PUBLISH', channel, '{"seq": ' .. seq .. ', ' .. body)
  return seq
end
local function is_terminal(state)
  return state == 'succeeded' or state == 'failed' or state == 'cancelled' or state == 'timeout'
    or state == 'expired'
end
-- A job leaves its queue's line (core/jobs.py, place_in_line) when it starts or ends; the key
-- names were stored in its hash by LINE_JOIN. A start also counts in the queue's service rate.
local function leave_line(job, id, started_at)
  local owner = redis.call('HGET', job, 'queued_owner')
  if owner then
    redis.call('HDEL', job, 'queued_owner')
    redis.call('HINCRBY', '""" + QUEUED_BY_OWNER + """', owner, -1)
  end
  local line = redis.call('HGET', job, 'line')
  if not line then return end
  redis.call('ZREM', line, id)
  -- The fair gate's count of a class's running jobs (core/fair_gate.py: a batch cap).
  local class = redis.call('HGET', job, 'priority')
  if class then
    if started_at then redis.call('ZADD', line .. ':running:' .. class, started_at, id)
    else redis.call('ZREM', line .. ':running:' .. class, id) end
  end
  if started_at then
    local starts = redis.call('HGET', job, 'line_starts')
    redis.call('ZADD', starts, started_at, id)
    redis.call('ZREMRANGEBYRANK', starts, 0, -65)  -- the last 64 starts
    redis.call('EXPIRE', starts, 3600)
  end
end
-- Every step that ends a job calls this: the job leaves the deadline sweep's set, and a job
-- with a webhook enters the outbox (due now), so no ending can miss its notification.
local function ended(job, id, ts, outbox, deadlines)
  leave_line(job, id, nil)
  if deadlines then redis.call('ZREM', deadlines, id) end
  if outbox and redis.call('HEXISTS', job, 'webhook_url') == 1 then
    redis.call('ZADD', outbox, ts, id)
  end
end
-- A queued job past its deadline ends ``expired`` (attempt unchanged: nothing ran).
local function expire(job, events, channel, id, ts, ttl, outbox, deadlines)
  local attempt = redis.call('HGET', job, 'attempt') or '0'
  local err = '{"code": "expired", "message": "the job reached its deadline before it started"}'
  redis.call('HSET', job, 'state', 'expired', 'finished_at', ts, 'error', err)
  local body = '"type": "expired", "attempt": ' .. attempt .. ', "ts": ' .. ts .. ', "data": ' .. err .. '}'
  local seq = append(job, events, channel, 'expired', attempt, ts, err, body, ttl)
  redis.call('EXPIRE', job, ttl)
  ended(job, id, ts, outbox, deadlines)
  return seq
end
"""

# KEYS: job, events, channel. ARGV: type, attempt, ts, data, body, ttl.
# Returns seq, or -1 (job ended), -2 (no such job), -3 (stale attempt).
APPEND_EVENT = _APPEND + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return -2 end
if is_terminal(state) then return -1 end
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[2] then return -3 end
return append(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
"""

# KEYS: job, index, undispatched, deadlines[, idempotency]. ARGV: job_id, created_at, ttl,
#   idempotency value the caller saw ('' = none), deadline ('' = none), then the record's
#   field/value pairs. A job with a deadline enters the deadline sweep's set.
# Creates the job and (with a 5th key) points the Idempotency-Key at it in one step, so a
# crash can never leave a key naming a job that does not exist. The job waits in
# ``undispatched`` until its task message is confirmed sent (see SWEEP_UNDISPATCHED).
# Returns the job id; with a key that another request set meanwhile, that request's job id.
CREATE = """
if KEYS[5] then
  local current = redis.call('GET', KEYS[5]) or ''
  if current ~= ARGV[4] then return current end
  redis.call('SET', KEYS[5], ARGV[1], 'EX', ARGV[3])
end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
if ARGV[5] ~= '' then redis.call('ZADD', KEYS[4], ARGV[5], ARGV[1]) end
return ARGV[1]
"""

# KEYS: job, events, channel, undispatched, outbox, deadlines. ARGV: job_id, ts, ttl, max_redispatches.
# A job still ``queued`` whose task message was never confirmed sent (the web or a reaper
# died between creating it and sending its task): bump its dispatch number (so a message
# that did go out after all is stale) and return it for a re-send; past the budget, fail
# the job ``enqueue_failed`` (-1). 0: nothing to do (the job started, ended or expired).
SWEEP_UNDISPATCHED = _APPEND + """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' then
  redis.call('ZREM', KEYS[4], ARGV[1])
  return 0
end
local ts = ARGV[2]
local attempt = redis.call('HGET', KEYS[1], 'attempt') or '0'
if redis.call('HINCRBY', KEYS[1], 'redispatches', 1) > tonumber(ARGV[4]) then
  local err = cjson.encode({code = 'enqueue_failed', message = 'the task message could not be sent'})
  redis.call('HSET', KEYS[1], 'state', 'failed', 'finished_at', ts, 'error', err)
  redis.call('ZREM', KEYS[4], ARGV[1])
  local body = '"type": "error", "attempt": ' .. attempt .. ', "ts": ' .. ts .. ', "data": ' .. err .. '}'
  append(KEYS[1], KEYS[2], KEYS[3], 'error', attempt, ts, err, body, ARGV[3])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  ended(KEYS[1], ARGV[1], ts, KEYS[5], KEYS[6])
  return -1
end
redis.call('ZADD', KEYS[4], ts, ARGV[1])
return redis.call('HINCRBY', KEYS[1], 'dispatch', 1)
"""

# KEYS: job, events, channel, leases, undispatched, pending, outbox, deadlines.
# ARGV: job_id, worker, ts, lease_deadline, ttl, dispatch.
# Returns {attempt, seq}; {0, 0} when the job already ended or the message is stale (its
# dispatch number is not the job's current one: the job was re-sent after a lease expired);
# {0, -1} when an attempt is already running: a message re-delivered by the broker (kombu
# restores unacked messages on a lost connection; Celery re-delivers a dead pool child's)
# never starts a second, concurrent attempt. A running job gets a new attempt only through
# REQUEUE, when the reaper judged its lease expired (fairly: see worker/reaper.py).
# {-1, seq} when the attempt budget is spent and the job was failed instead (poison message).
# {-2, seq} when the job's deadline has passed: it ends ``expired`` and never runs.
# A started attempt also gets the job's fields (HGETALL, flat) as a third element: the worker
# reads the stored request in the same round trip instead of reading the hash back.
START_ATTEMPT = _APPEND + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state or is_terminal(state) then return {0, 0} end
if state == 'running' then return {0, -1} end
if (redis.call('HGET', KEYS[1], 'dispatch') or '0') ~= ARGV[6] then return {0, 0} end
redis.call('ZREM', KEYS[5], ARGV[1])  -- its message arrived: nothing left to sweep
redis.call('ZREM', KEYS[6], ARGV[1])
local deadline = redis.call('HGET', KEYS[1], 'deadline')
if deadline and tonumber(ARGV[3]) >= tonumber(deadline) then
  return {-2, expire(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[3], ARGV[5], KEYS[7], KEYS[8])}
end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
local max_attempts = tonumber(redis.call('HGET', KEYS[1], 'max_attempts'))
local ts = ARGV[3]
if attempt > max_attempts then
  local reason = 'gave up after ' .. max_attempts .. ' attempts: the worker died while running this job'
  local err = cjson.encode({code = 'worker_lost', message = reason})
  redis.call('HSET', KEYS[1], 'state', 'failed', 'finished_at', ts, 'error', err)
  redis.call('ZREM', KEYS[4], ARGV[1])
  local body = '"type": "error", "attempt": ' .. attempt .. ', "ts": ' .. ts .. ', "data": ' .. err .. '}'
  local seq = append(KEYS[1], KEYS[2], KEYS[3], 'error', attempt, ts, err, body, ARGV[5])
  ended(KEYS[1], ARGV[1], ts, KEYS[7], KEYS[8])
  return {-1, seq}
end
redis.call('HSET', KEYS[1], 'state', 'running', 'worker', ARGV[2], 'started_at', ts)
leave_line(KEYS[1], ARGV[1], ts)
redis.call('EXPIRE', KEYS[1], ARGV[5])  -- a queue wait must not eat the running job's TTL
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
local data = cjson.encode({state = 'running', worker = ARGV[2], restart = attempt > 1})
local body = '"type": "state", "attempt": ' .. attempt .. ', "ts": ' .. ts .. ', "data": ' .. data .. '}'
local seq = append(KEYS[1], KEYS[2], KEYS[3], 'state', attempt, ts, data, body, ARGV[5])
return {attempt, seq, redis.call('HGETALL', KEYS[1])}
"""

# KEYS: job, events, channel, leases, outbox, deadlines. ARGV: job_id, state, type, attempt ('' = any), ts,
#   data (kept in the hash), ttl, field name ('result' | 'error'), event data (a summary of
#   data: core/payloads.py; the full result is stored once, in the hash).
# Returns seq of the terminal event, or 0 when the job had already ended / attempt is stale.
FINISH = _APPEND + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state or is_terminal(state) then return 0 end
local attempt = redis.call('HGET', KEYS[1], 'attempt')
if ARGV[4] ~= '' and attempt ~= ARGV[4] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'finished_at', ARGV[5], ARGV[8], ARGV[6])
redis.call('ZREM', KEYS[4], ARGV[1])
local ttl = tonumber(ARGV[7])
local body = '"type": "' .. ARGV[3] .. '", "attempt": ' .. attempt .. ', "ts": ' .. ARGV[5] .. ', "data": ' .. ARGV[9] .. '}'
local seq = append(KEYS[1], KEYS[2], KEYS[3], ARGV[3], attempt, ARGV[5], ARGV[9], body, ttl)
redis.call('EXPIRE', KEYS[1], ttl)
ended(KEYS[1], ARGV[1], ARGV[5], KEYS[5], KEYS[6])
return seq
"""

# KEYS: job, events, channel, leases, undispatched. ARGV: job_id, attempt, ts, ttl, reason
#   ('lease_expired' | 'worker_dead' | 'process_lost').
# Puts a running job whose lease expired (or whose worker stopped beating) back to queued and bumps its dispatch number, so
# the dead attempt's message, if the broker ever re-delivers it, is recognised as stale.
# Returns the new dispatch number (the caller re-sends the task with it), or 0. Until the
# caller confirms the re-send, the job waits in ``undispatched``.
REQUEUE = _APPEND + """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'running' or redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[2] then
  redis.call('ZREM', KEYS[4], ARGV[1])
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'queued')
redis.call('EXPIRE', KEYS[1], ARGV[4])
local dispatch = redis.call('HINCRBY', KEYS[1], 'dispatch', 1)
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[3], ARGV[1])
local data = cjson.encode({state = 'queued', reason = ARGV[5]})
local body = '"type": "state", "attempt": ' .. ARGV[2] .. ', "ts": ' .. ARGV[3] .. ', "data": ' .. data .. '}'
append(KEYS[1], KEYS[2], KEYS[3], 'state', ARGV[2], ARGV[3], data, body, ARGV[4])
return dispatch
"""

# KEYS: job. ARGV: field. Marks a finished job as counted in the metrics totals; returns 1
# for exactly one caller (0 when already counted, or when the job hash expired meanwhile,
# so no orphan hash without a TTL is created).
CLAIM_FOR_METRICS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return redis.call('HSETNX', KEYS[1], ARGV[1], '1')
"""

# KEYS: job, events, channel, deadlines, undispatched, pending, outbox. ARGV: job_id, ts, ttl.
# The deadline sweep: a job still ``queued`` at its deadline ends ``expired`` with its one
# terminal event (its task message, when a worker takes it, finds the job ended and skips).
# Returns the event's seq, or 0: not due, running (its worker ends it ``timeout``), or
# already ended / gone (then it leaves the set).
EXPIRE_QUEUED = _APPEND + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state or is_terminal(state) then
  redis.call('ZREM', KEYS[4], ARGV[1])
  return 0
end
if state ~= 'queued' then return 0 end
local deadline = tonumber(redis.call('HGET', KEYS[1], 'deadline') or '')
if not deadline or tonumber(ARGV[2]) < deadline then return 0 end
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
return expire(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], KEYS[7], KEYS[4])
"""

# KEYS: job, line, line_starts, seq. ARGV: job_id. The job's message was just sent to the
# queue whose line this is: it joins the line's end (the order of sends is the order the
# queue's FIFO list hands messages out), unless it already started or ended meanwhile.
# Returns its place in the sending order, or 0.
LINE_JOIN = """
if redis.call('HGET', KEYS[1], 'state') ~= 'queued' then return 0 end
local old = redis.call('HGET', KEYS[1], 'line')
if old then redis.call('ZREM', old, ARGV[1]) end
local n = redis.call('INCR', KEYS[4])
redis.call('ZADD', KEYS[2], n, ARGV[1])
redis.call('HSET', KEYS[1], 'line', KEYS[2], 'line_starts', KEYS[3])
return n
"""
