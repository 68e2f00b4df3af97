-- pop_newest: remove the newest live record of one session, atomically (the OpenAI
-- Agents SDK's Session.pop_item: "undo the last turn").
-- The record leaves the transcript with its bytes, turn (and tool-result) count and
-- idempotency receipt, and the shard's byte total drops by the same amount; one
-- event popped_newest (seq, bytes, turns left; never content). When it was the
-- session's last live record, the session ends whole instead (summary and archive
-- too, bytes as every session-ending call keeps them), with that one event.
-- A session idle past its TTL has no live record: it ends as expired_inactivity
-- (as record_turn would end it) and nothing is popped. Not activity: the session's
-- last-active time stays where its last recorded turn put it.
-- KEYS: the shard scripts' layout with a session (lib.lua Args:shard_keys), read by name:
-- KEYS[1]  = gm:{shard}:s:<uuid>:<ch>:meta     (hash)   sid, turns, bytes, tools
-- KEYS[2]  = gm:{shard}:s:<uuid>:<ch>:turns    (zset)   score = seq, member = record
-- KEYS[3]  = gm:{shard}:s:<uuid>:<ch>:idem     (hash)   idempotency key -> receipt
-- KEYS[4]  = gm:{shard}:s:<uuid>:<ch>:summary  (string) factual summary
-- KEYS[5]  = gm:{shard}:s:<uuid>:<ch>:archive  (zset)   archived records
-- KEYS[6]  = gm:{shard}:lru:public             (zset)   last activity, public sessions
-- KEYS[7]  = gm:{shard}:lru:im                 (zset)   last activity, IM sessions
-- KEYS[8]  = gm:{shard}:sessions               (zset)   every session
-- KEYS[9]  = gm:{shard}:seq                    (string) sequence counter (unused here)
-- KEYS[10] = gm:{shard}:clock                  (hash)   clock domain (read only)
-- KEYS[11] = gm:{shard}:events                 (stream) events
-- KEYS[12] = gm:{shard}:stats                  (hash)   bytes: the shard's stored bytes
-- ARGV[1]  = now_mono (integer ms, caller's monotonic clock)
-- ARGV[2]  = now_wall (integer ms since the epoch), the event's time
-- ARGV[3]  = boot_id of the caller's monotonic clock
-- ARGV[4]  = member '<uuid>:<channel>' of this session
-- ARGV[5]  = max_events (exact MAXLEN of the event stream)
-- Returns: {popped(0|1), entry ('' when none), ended(0|1)}: the removed transcript
--          member, and whether the session ended whole with it (or expired)
-- Flags:   allow-oom (it frees memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument, "GM_BADARG keys" on KEYS
--          not in the layout (nothing written either way)

local args = new_args()

local keys = args:shard_keys(KEYS, true)
local mono, wall, boot = args:clock(ARGV[1], ARGV[2], ARGV[3])
local member, _, channel = args:member('member', ARGV[4])
local max_events = args:int('max_events', ARGV[5], 1)
local err = args:error()
if err then return err end

local shard = shard_context(keys, max_events, wall)
local meta = redis.call('HMGET', keys.meta, 'sid', 'turns', 'bytes', 'tools')
local sid = meta[1]
if not sid then return { 0, '', 0 } end

-- Read-only clock: popping is not activity, so it fixes no boot offset either.
local now = store_now(keys.clock, boot, mono, wall, false)
if is_expired(shard.lru[channel], member, channel, now) then
  end_session(shard, keys.own, member, REASON.expired_inactivity)
  return { 0, '', 1 }
end

local newest = redis.call('ZRANGE', keys.turns, -1, -1, 'WITHSCORES')
if #newest == 0 then return { 0, '', 0 } end
local entry, seq = newest[1], tonumber(newest[2])
local turns = (tonumber(meta[2]) or 0) - 1
if turns <= 0 then
  end_session(shard, keys.own, member, REASON.popped_newest)
  return { 1, entry, 1 }
end

redis.call('ZREM', keys.turns, entry)
local is_tool = string.match(entry, '^%d+|%d+|%x+|%["t"') ~= nil
local tools = (tonumber(meta[4]) or 0) - (is_tool and 1 or 0)
local bytes = (tonumber(meta[3]) or 0) - #entry
redis.call('HSET', keys.meta, 'turns', turns, 'bytes', bytes, 'tools', math.max(tools, 0))
redis.call('HINCRBY', shard.stats, 'bytes', -#entry)
-- Its receipt goes with it: a resend of that key records the turn again.
local receipts = redis.call('HGETALL', keys.idem)
for i = 1, #receipts, 2 do
  if tonumber(string.match(receipts[i + 1], '^(%d+):')) == seq then
    redis.call('HDEL', keys.idem, receipts[i])
  end
end
emit(shard, REASON.popped_newest, sid, member, 'seq', seq, 'bytes', #entry, 'turns', turns)
return { 1, entry, 0 }
