-- restore_session: write one validated session from a snapshot, unless it is live.
-- Never overwrites a live session. The session's last activity is set `age_ms`
-- before now, so its TTL continues from the snapshot. Afterwards the same bounds
-- as record_turn hold: the session is compacted if over its own bounds and the
-- shard evicts least-recently-active sessions if over its bounds (restore the
-- oldest sessions first so the newest survive). The sequence counter is raised
-- past the restored records, so new turns always sort after them.
-- KEYS: the shard scripts' layout with a session (lib.lua Args:shard_keys), read by name:
-- KEYS[1]  = gm:{shard}:s:<uuid>:<ch>:meta     (hash)
-- KEYS[2]  = gm:{shard}:s:<uuid>:<ch>:turns    (zset)
-- KEYS[3]  = gm:{shard}:s:<uuid>:<ch>:idem     (hash)
-- KEYS[4]  = gm:{shard}:s:<uuid>:<ch>:summary  (string)
-- KEYS[5]  = gm:{shard}:s:<uuid>:<ch>:archive  (zset)
-- KEYS[6]  = gm:{shard}:lru:public             (zset)
-- KEYS[7]  = gm:{shard}:lru:im                 (zset)
-- KEYS[8]  = gm:{shard}:sessions               (zset)
-- KEYS[9]  = gm:{shard}:seq                    (string)
-- KEYS[10] = gm:{shard}:clock                  (hash)
-- KEYS[11] = gm:{shard}:events                 (stream)
-- KEYS[12] = gm:{shard}:stats                  (hash)
-- ARGV[1]  = now_mono (integer ms)
-- ARGV[2]  = now_wall (integer ms)
-- ARGV[3]  = boot_id
-- ARGV[4]  = member '<uuid>:<channel>'
-- ARGV[5]  = session ID (32 lowercase hex)
-- ARGV[6]  = created_ms (wall)
-- ARGV[7]  = active_ms (wall of the last activity)
-- ARGV[8]  = age_ms: how long ago the last activity was (>= 0, below the TTL)
-- ARGV[9]  = summary ('' for none)
-- ARGV[10] = max_events
-- ARGV[11] = limits packet (as record_turn)
-- ARGV[12] = receipt count n
-- ARGV[13] = archive segments: 'first-last-bytes' items, comma-separated, oldest first ('' for none)
-- ARGV[14] = archive entry count m
-- ARGV[15..] = n receipt pairs (idempotency key, receipt), then m archive entries, then the
--            live records; entries and records are '<seq>|<wall ms>|<session id>|<payload>',
--            seq strictly increasing across both
-- Returns: 1 if restored, 0 if a live session already had this key (nothing written)
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument, "GM_BADARG keys" on KEYS
--          not in the layout (nothing written either way)

local args = new_args()

local keys = args:shard_keys(KEYS, true)
local mono, wall, boot = args:clock(ARGV[1], ARGV[2], ARGV[3])
local member, _, channel = args:member('member', ARGV[4])
local sid = args:str('session_id', ARGV[5], SESSION_ID_PATTERN)
local created = args:int('created_ms', ARGV[6], 0)
local active = args:int('active_ms', ARGV[7], 0)
local age = args:int('age_ms', ARGV[8], 0, TTL_MS[channel] - 1)
local summary = ARGV[9] or ''
local max_events = args:int('max_events', ARGV[10], 1)
local limits = args:limits('limits', ARGV[11])
local receipts = args:int('receipts', ARGV[12], 0, 100000)
local segments_text = args:str('segments', ARGV[13], '^[%d%-,]*$')
local archived = args:int('archive', ARGV[14], 0, 10000000)
local first_archived = 15 + 2 * receipts
local first_record = first_archived + archived
for i = 15, first_archived - 1, 2 do
  args:str('receipt_key', ARGV[i], '^[%w%-_.:]+$')
  args:str('receipt', ARGV[i + 1], '^%d+:[01]:%d+:[01]$')
end

-- {seq, entry, seq, entry, ...} of ARGV[from..to], checked; updates `previous`
local previous = 0
local function entries(from, to, field)
  local out, bytes, tools = {}, 0, 0
  for i = from, to do
    local seq, rsid, payload = string.match(ARGV[i], '^(%d+)|%d+|(%x+)|(%[.*)$')
    seq = tonumber(seq)
    if seq == nil or seq <= previous or rsid ~= sid then
      args:fail(field)
      break
    end
    previous = seq
    out[#out + 1] = seq
    out[#out + 1] = ARGV[i]
    bytes = bytes + #ARGV[i]
    if string.sub(payload, 1, 4) == '["t"' then tools = tools + 1 end
  end
  return out, bytes, tools
end
local archive, abytes = entries(first_archived, first_record - 1, 'archive')
local records, turn_bytes, tools = entries(first_record, #ARGV, 'records')
if #records == 0 then args:fail('records') end
local segments, covered = parse_segments(segments_text), 0
for _, seg in ipairs(segments) do covered = covered + seg[3] end
if covered ~= abytes then args:fail('segments') end
local err = args:error()
if err then return err end

if redis.call('EXISTS', keys.meta) == 1 then return 0 end

local shard = shard_context(keys, max_events, wall)
local now = store_now(keys.clock, boot, mono, wall, true)

-- in chunks: Lua's unpack() refuses a few thousand values at once
for i = 1, #records, 1000 do
  redis.call('ZADD', keys.turns, unpack(records, i, math.min(i + 999, #records)))
end
for i = 15, first_archived - 1, 1000 do
  redis.call('HSET', keys.idem, unpack(ARGV, i, math.min(i + 999, first_archived - 1)))
end
for i = 1, #archive, 1000 do
  redis.call('ZADD', keys.archive, unpack(archive, i, math.min(i + 999, #archive)))
end
if summary ~= '' then redis.call('SET', keys.summary, summary) end
redis.call('ZADD', shard.sessions, 0, member)
redis.call('ZADD', shard.lru[channel], now - age, member)
if tonumber(redis.call('GET', keys.seq) or '0') < previous then
  redis.call('SET', keys.seq, previous)
end

if abytes > 0 then redis.call('HSET', keys.meta, 'segments', segments_text, 'abytes', abytes) end
local s = { keys = keys.own, turns = #records / 2, tools = tools, bytes = turn_bytes + #summary }
keep_session_bounds(shard, s, sid, member, limits)
local bytes = s.bytes
redis.call('HSET', keys.meta, 'sid', sid, 'created', created, 'active', active,
  'turns', s.turns, 'bytes', bytes, 'tools', s.tools)
redis.call('HINCRBY', shard.stats, 'bytes', bytes + abytes + (s.archive_delta or 0))
evict_over_bounds(shard, limits, member, now)
return 1
