-- record_turn: append one redacted, bounded record to a session, atomically.
-- Expires the session first if it has been idle for its channel's TTL (event
-- expired_inactivity, a fresh session ID), and answers a repeated idempotency
-- key with the first receipt, storing nothing.
-- KEYS[1]  = gm:{shard}:s:<uuid>:<ch>:meta     (hash)   sid, created, active, turns, bytes
-- KEYS[2]  = gm:{shard}:s:<uuid>:<ch>:turns    (zset)   score = seq, member = record
-- KEYS[3]  = gm:{shard}:s:<uuid>:<ch>:idem     (hash)   idempotency key -> receipt
-- KEYS[4]  = gm:{shard}:s:<uuid>:<ch>:summary  (string) factual summary
-- KEYS[5]  = gm:{shard}:s:<uuid>:<ch>:archive  (zset)   archived records
-- KEYS[6]  = gm:{shard}:lru:<ch>               (zset)   score = last activity (store ms)
-- KEYS[7]  = gm:{shard}:sessions               (zset)   every session, score 0
-- KEYS[8]  = gm:{shard}:seq                    (string) sequence counter
-- KEYS[9]  = gm:{shard}:clock                  (hash)   clock domain
-- KEYS[10] = gm:{shard}:events                 (stream) events
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
-- Returns: {session_id, seq, new_session(0|1), duplicate(0|1), redactions, truncated(0|1)}
-- Errors:  "GM_BADARG <field>" on a malformed argument (nothing written)
--          "GM_CORRUPT idem" when a stored receipt cannot be read

local mono, wall, boot = arg_clock(ARGV[1], ARGV[2], ARGV[3])
local member, _, channel = arg_member('member', ARGV[4])
local candidate = arg_str('session_id', ARGV[5], SESSION_ID_PATTERN)
local payload = arg_str('payload', ARGV[6], '^%[')
local idem = arg_str('idempotency_key', ARGV[7], '^[%w%-_.:]*$')
local redactions = arg_int('redactions', ARGV[8], 0)
local truncated = arg_int('truncated', ARGV[9], 0, 1)
local max_events = arg_int('max_events', ARGV[10], 1)
local err = arg_error()
if err then return err end

local now = store_now(KEYS[9], boot, mono, wall, true)
local sid = redis.call('HGET', KEYS[1], 'sid')
local last = nil
if sid then
  local expired
  expired, last = is_expired(KEYS[6], member, channel, now)
  if expired then
    end_session({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}, member, KEYS[6], KEYS[7],
      KEYS[10], max_events, 'expired_inactivity', wall)
    sid = false
    last = nil
  end
end

if sid and idem ~= '' then
  local prior = redis.call('HGET', KEYS[3], idem)
  if prior then
    local pseq, pnew, pred, ptrunc = string.match(prior, '^(%d+):([01]):(%d+):([01])$')
    if pseq == nil then return redis.error_reply('GM_CORRUPT idem') end
    return {sid, tonumber(pseq), tonumber(pnew), 1, tonumber(pred), tonumber(ptrunc)}
  end
end

local new_session = 0
if not sid then
  sid = candidate
  new_session = 1
  redis.call('HSET', KEYS[1], 'sid', sid, 'created', wall, 'turns', 0, 'bytes', 0)
  redis.call('ZADD', KEYS[7], 0, member)
end

local seq = redis.call('INCR', KEYS[8])
local entry = seq .. '|' .. wall .. '|' .. sid .. '|' .. payload
redis.call('ZADD', KEYS[2], seq, entry)
redis.call('HINCRBY', KEYS[1], 'turns', 1)
redis.call('HINCRBY', KEYS[1], 'bytes', #entry)
redis.call('HSET', KEYS[1], 'active', wall)
-- Activity never moves backwards, even when a slower caller's clock reading lands late.
if last == nil or now > last then
  redis.call('ZADD', KEYS[6], now, member)
end
if idem ~= '' then
  redis.call('HSET', KEYS[3], idem, seq .. ':' .. new_session .. ':' .. redactions .. ':' .. truncated)
end
return {sid, seq, new_session, 0, redactions, truncated}
