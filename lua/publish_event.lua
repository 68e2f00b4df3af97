-- publish_event: publish an event that no other script owns (snapshots, permissions).
-- Events carry reason codes, IDs and counts, never content.
-- KEYS[1] = gm:{shard}:events  (stream)  events
-- KEYS[2] = gm:{shard}:stats   (hash)    all-time event counts ('events:<reason>')
-- ARGV[1] = now_wall (integer ms)
-- ARGV[2] = reason: snapshot_quarantined, snapshot_restored, permissions_not_verified,
--           or expired_inactivity (a snapshot's session too old to restore)
-- ARGV[3] = max_events
-- ARGV[4] = session ID, '' for none
-- ARGV[5] = member '<uuid>:<channel>', '' for none
-- ARGV[6..] = detail: field, value pairs; fields lowercase words, values [%w_.:-]*
-- Returns: the new event's stream ID
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local args = new_args()

local wall = args:int('now_wall', ARGV[1], 0)
local reason = args:str('reason', ARGV[2], '^[%l_]+$')
local allowed = {
  [REASON.snapshot_quarantined] = true, [REASON.snapshot_restored] = true,
  [REASON.permissions_not_verified] = true, [REASON.expired_inactivity] = true,
}
if not allowed[reason] then args:fail('reason') end
local max_events = args:int('max_events', ARGV[3], 1)
local sid = ''
if ARGV[4] ~= '' then sid = args:str('session_id', ARGV[4], SESSION_ID_PATTERN) end
local member, uuid, channel = '', '', ''
if ARGV[5] ~= '' then member, uuid, channel = args:member('member', ARGV[5]) end
if (#ARGV - 5) % 2 ~= 0 then args:fail('detail') end
local detail = {}
for i = 6, #ARGV, 2 do
  local field = args:str('detail', ARGV[i], '^[%l_]+$')
  local value = args:str('detail', ARGV[i + 1], '^[%w_.:%-]*$')
  if field == 'reason' or field == 'at' or field == 'sid' or field == 'uuid' or field == 'ch' then
    args:fail('detail')
  end
  detail[#detail + 1] = field
  detail[#detail + 1] = value
end
local err = args:error()
if err then return err end

redis.call('HINCRBY', KEYS[2], 'events:' .. reason, 1)
return redis.call('XADD', KEYS[1], 'MAXLEN', max_events, '*', 'reason', reason, 'at', wall,
  'sid', sid, 'uuid', uuid, 'ch', channel, unpack(detail))
