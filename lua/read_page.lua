-- read_page: one chronological page of a session's transcript, for operators.
-- Read-only; never used by read_context. Pages are anchored on sequence numbers
-- (exclusive), so a page never repeats a record. The archive joins in a later issue.
-- KEYS[1] = gm:{shard}:s:<uuid>:<ch>:meta   (hash)  session metadata
-- KEYS[2] = gm:{shard}:s:<uuid>:<ch>:turns  (zset)  score = seq
-- KEYS[3] = gm:{shard}:lru:<ch>             (zset)  last activity
-- KEYS[4] = gm:{shard}:clock                (hash)  clock domain
-- ARGV[1] = now_mono (integer ms)
-- ARGV[2] = now_wall (integer ms)
-- ARGV[3] = boot_id
-- ARGV[4] = member '<uuid>:<channel>'
-- ARGV[5] = anchor seq (exclusive), '' to start at the newest (backward) or oldest (forward)
-- ARGV[6] = direction: 'backward' (older than anchor) or 'forward' (newer than anchor)
-- ARGV[7] = limit (1..200)
-- Returns: {has_more(0|1), record, record, ...} oldest first; {0} for no live session
-- Errors:  "GM_BADARG <field>" on a malformed argument

local mono, wall, boot = arg_clock(ARGV[1], ARGV[2], ARGV[3])
local member, _, channel = arg_member('member', ARGV[4])
local anchor = nil
if ARGV[5] ~= '' then anchor = arg_int('anchor', ARGV[5], 0) end
local direction = arg_str('direction', ARGV[6], '^%l+$')
if direction ~= 'backward' and direction ~= 'forward' then bad_field = bad_field or 'direction' end
local limit = arg_int('limit', ARGV[7], 1, 200)
local err = arg_error()
if err then return err end

if not redis.call('HGET', KEYS[1], 'sid') then return {0} end
local now = store_now(KEYS[4], boot, mono, wall, false)
if is_expired(KEYS[3], member, channel, now) then return {0} end

local rows
if direction == 'backward' then
  local top = '+inf'
  if anchor then top = '(' .. anchor end
  rows = redis.call('ZREVRANGEBYSCORE', KEYS[2], top, '-inf', 'LIMIT', 0, limit + 1)
else
  local bottom = '-inf'
  if anchor then bottom = '(' .. anchor end
  rows = redis.call('ZRANGEBYSCORE', KEYS[2], bottom, '+inf', 'LIMIT', 0, limit + 1)
end

local has_more = 0
if #rows > limit then
  has_more = 1
  rows[#rows] = nil
end
local reply = {has_more}
if direction == 'backward' then
  for i = #rows, 1, -1 do reply[#reply + 1] = rows[i] end
else
  for i = 1, #rows do reply[#reply + 1] = rows[i] end
end
return reply
