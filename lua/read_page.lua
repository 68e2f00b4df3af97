-- read_page: one chronological page of a session's transcript, for operators.
-- Read-only; not part of context() (gridmem/reads.py, lua/read_context.lua).
-- Pages run over the archive (opt-in: records folded out of the live context)
-- and the live transcript as one sequence, anchored on sequence numbers
-- (exclusive), so a page never repeats a record and a walk sees each exactly once.
-- KEYS[1] = gm:{shard}:s:<uuid>:<ch>:meta     (hash)  session metadata
-- KEYS[2] = gm:{shard}:s:<uuid>:<ch>:turns    (zset)  live records, score = seq
-- KEYS[3] = gm:{shard}:s:<uuid>:<ch>:archive  (zset)  archived records, score = seq
-- KEYS[4] = gm:{shard}:lru:<ch>               (zset)  last activity
-- KEYS[5] = gm:{shard}:clock                  (hash)  clock domain
-- ARGV[1] = now_mono (integer ms)
-- ARGV[2] = now_wall (integer ms)
-- ARGV[3] = boot_id
-- ARGV[4] = member '<uuid>:<channel>'
-- ARGV[5] = anchor seq (exclusive), '' to start at the newest (backward) or oldest (forward)
-- ARGV[6] = direction: 'backward' (older than anchor) or 'forward' (newer than anchor)
-- ARGV[7] = limit (1..200)
-- Returns: {has_more(0|1), record, record, ...} oldest first; {0} for no live session
-- Flags:   no-writes (read-only; runs even while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local args = new_args()

local mono, wall, boot = args:clock(ARGV[1], ARGV[2], ARGV[3])
local member, _, channel = args:member('member', ARGV[4])
local anchor = nil
if ARGV[5] ~= '' then anchor = args:int('anchor', ARGV[5], 0) end
local direction = args:str('direction', ARGV[6], '^%l+$')
if direction ~= 'backward' and direction ~= 'forward' then args:fail('direction') end
local limit = args:int('limit', ARGV[7], 1, 200)
local err = args:error()
if err then return err end

if not redis.call('HGET', KEYS[1], 'sid') then return { 0 } end
local now = store_now(KEYS[5], boot, mono, wall, false)
if is_expired(KEYS[4], member, channel, now) then return { 0 } end

-- Up to limit + 1 entries (with scores) from each set, nearest the anchor first.
local function window(key)
  if direction == 'backward' then
    local top = anchor and ('(' .. anchor) or '+inf'
    return redis.call('ZREVRANGEBYSCORE', key, top, '-inf', 'WITHSCORES', 'LIMIT', 0, limit + 1)
  end
  local bottom = anchor and ('(' .. anchor) or '-inf'
  return redis.call('ZRANGEBYSCORE', key, bottom, '+inf', 'WITHSCORES', 'LIMIT', 0, limit + 1)
end

-- Merge both windows nearest-first, one record per sequence number.
local merged = {}
for _, key in ipairs({ KEYS[2], KEYS[3] }) do
  local rows = window(key)
  for i = 1, #rows, 2 do merged[#merged + 1] = { tonumber(rows[i + 1]), rows[i] } end
end
table.sort(merged, function(a, b)
  if direction == 'backward' then return a[1] > b[1] end
  return a[1] < b[1]
end)
local page, last_seq = {}, nil
for _, row in ipairs(merged) do
  if row[1] ~= last_seq then
    page[#page + 1] = row[2]
    last_seq = row[1]
  end
end

local has_more = 0
if #page > limit then
  has_more = 1
  for i = #page, limit + 1, -1 do page[i] = nil end
end
local reply = { has_more }
if direction == 'backward' then
  for i = #page, 1, -1 do reply[#reply + 1] = page[i] end
else
  for i = 1, #page do reply[#reply + 1] = page[i] end
end
return reply
