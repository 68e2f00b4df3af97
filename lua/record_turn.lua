-- record_turn: append one redacted, bounded record to a session, atomically, and keep every bound.
-- Expires the session first if it has been idle for its channel's TTL (event
-- expired_inactivity, a fresh session ID), and answers a repeated idempotency
-- key with the first receipt, storing nothing. Over its turn, byte or
-- tool-result bound, the session folds its oldest records into the factual
-- summary (event compacted; summary_trimmed when old lines drop). Over the
-- shard's session or byte bound, least-recently-active sessions other than this
-- one are removed whole (evicted_session_limit / evicted_aggregate_bytes).
-- Every write also expires up to limits.sweep_batch other sessions of the shard
-- idle past their TTL (expired_inactivity each, oldest first; before the shard
-- bounds are checked), so a store that is only written and read frees expired
-- chat without anyone calling sweep().
-- KEYS: the shard scripts' layout with a session (lib.lua Args:shard_keys), read by name:
-- KEYS[1]  = gm:{shard}:s:<uuid>:<ch>:meta     (hash)   sid, created, active, turns, bytes, tools
-- KEYS[2]  = gm:{shard}:s:<uuid>:<ch>:turns    (zset)   score = seq, member = record
-- KEYS[3]  = gm:{shard}:s:<uuid>:<ch>:idem     (hash)   idempotency key -> receipt
-- KEYS[4]  = gm:{shard}:s:<uuid>:<ch>:summary  (string) factual summary
-- KEYS[5]  = gm:{shard}:s:<uuid>:<ch>:archive  (zset)   archived records
-- KEYS[6]  = gm:{shard}:lru:public             (zset)   score = last activity (store ms)
-- KEYS[7]  = gm:{shard}:lru:im                 (zset)   score = last activity (store ms)
-- KEYS[8]  = gm:{shard}:sessions               (zset)   every session, score 0
-- KEYS[9]  = gm:{shard}:seq                    (string) sequence counter
-- KEYS[10] = gm:{shard}:clock                  (hash)   clock domain
-- KEYS[11] = gm:{shard}:events                 (stream) events
-- KEYS[12] = gm:{shard}:stats                  (hash)   bytes (stored), redactions (made)
-- ARGV[1]  = now_mono (integer ms, caller's monotonic clock)
-- ARGV[2]  = now_wall (integer ms since the epoch)
-- ARGV[3]  = boot_id of the caller's monotonic clock
-- ARGV[4]  = member '<uuid>:<channel>' of this session
-- ARGV[5]  = candidate session ID (32 lowercase hex), used only if a new session starts
-- ARGV[6]  = payload (encoded record, already redacted and bounded)
-- ARGV[7]  = idempotency key, '' for none
-- ARGV[8]  = redactions (integer >= 0), kept for a repeated receipt
-- ARGV[9]  = truncated (0|1), kept for a repeated receipt
-- ARGV[10] = max_events (exact MAXLEN of the event stream)
-- ARGV[11] = limits packet: comma-separated integers, LIMIT_FIELDS order (prelude);
--            sweep_batch = most other expired sessions this call ends (0: none)
-- ARGV[12] = required session ID: '' (any: a new session if none is live), or the ID
--            the live session must have (an answer goes only into the session whose
--            context it answers); with another or none, nothing is stored (an expiry
--            that was due still happens) and the reply is {'', 0, 0, 0, 0, 0}
-- Returns: {session_id, seq, new_session(0|1), duplicate(0|1), redactions, truncated(0|1)}
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument, "GM_BADARG keys" on KEYS
--          not in the layout (nothing written either way)
--          "GM_CORRUPT idem" when a stored receipt cannot be read

local args = new_args()

local keys = args:shard_keys(KEYS, true)
local mono, wall, boot = args:clock(ARGV[1], ARGV[2], ARGV[3])
local member, _, channel = args:member('member', ARGV[4])
local candidate = args:str('session_id', ARGV[5], SESSION_ID_PATTERN)
local payload = args:str('payload', ARGV[6], '^%[')
local idem = args:str('idempotency_key', ARGV[7], '^[%w%-_.:]*$')
local redactions = args:int('redactions', ARGV[8], 0)
local truncated = args:int('truncated', ARGV[9], 0, 1)
local max_events = args:int('max_events', ARGV[10], 1)
local limits = args:limits('limits', ARGV[11])
local required = ARGV[12]
if required ~= '' then required = args:str('required_session', required, SESSION_ID_PATTERN) end
local err = args:error()
if err then return err end

local shard = shard_context(keys, max_events, wall)
local now = store_now(keys.clock, boot, mono, wall, true)

local meta = redis.call('HMGET', keys.meta, 'sid', 'turns', 'bytes', 'tools')
local sid = meta[1]
local last = nil
if sid then
  local expired
  expired, last = is_expired(shard.lru[channel], member, channel, now)
  if expired then
    end_session(shard, keys.own, member, REASON.expired_inactivity)
    sid, last = false, nil
  end
end

if required ~= '' and sid ~= required then
  return { '', 0, 0, 0, 0, 0 }  -- the required session ended (or never was): store nothing
end

if sid and idem ~= '' then
  local prior = redis.call('HGET', keys.idem, idem)
  if prior then
    local pseq, pnew, pred, ptrunc = string.match(prior, '^(%d+):([01]):(%d+):([01])$')
    if pseq == nil then return redis.error_reply('GM_CORRUPT idem') end
    return { sid, tonumber(pseq), tonumber(pnew), 1, tonumber(pred), tonumber(ptrunc) }
  end
end

local new_session = 0
if not sid then
  sid, new_session = candidate, 1
  meta = { sid, '0', '0', '0' }
  redis.call('HSET', keys.meta, 'sid', sid, 'created', wall)
  redis.call('ZADD', shard.sessions, 0, member)
end

-- append
local seq = redis.call('INCR', keys.seq)
local entry = seq .. '|' .. wall .. '|' .. sid .. '|' .. payload
redis.call('ZADD', keys.turns, seq, entry)
local old_bytes = tonumber(meta[3]) or 0
local s = {
  keys = keys.own,
  turns = (tonumber(meta[2]) or 0) + 1,
  tools = (tonumber(meta[4]) or 0) + (string.sub(payload, 1, 4) == '["t"' and 1 or 0),
  bytes = old_bytes + #entry,  -- records and summary (the summary is read only to fold)
}
-- Activity never moves backwards, even when a slower caller's clock reading lands late.
if last == nil or now > last then
  redis.call('ZADD', shard.lru[channel], now, member)
end
if idem ~= '' then
  redis.call('HSET', keys.idem, idem, seq .. ':' .. new_session .. ':' .. redactions .. ':' .. truncated)
end

keep_session_bounds(shard, s, sid, member, limits)

local bytes = s.bytes
redis.call('HSET', keys.meta, 'active', wall, 'turns', s.turns, 'bytes', bytes, 'tools', s.tools)
-- A few idle sessions of this shard go with every write, before the bound check
-- below counts them: expired chat leaves even if nobody ever sweeps.
expire_idle(shard, now, limits.sweep_batch)
local total = redis.call('HINCRBY', shard.stats, 'bytes', bytes - old_bytes + (s.archive_delta or 0))
if redactions > 0 then redis.call('HINCRBY', shard.stats, 'redactions', redactions) end

-- evict: only a new session or a larger total can have crossed a shard bound
if new_session == 1 or total > limits.max_aggregate_bytes then
  evict_over_bounds(shard, limits, member, now)
end
return { sid, seq, new_session, 0, redactions, truncated }
