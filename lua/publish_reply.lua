-- publish_reply: put the agent's visible (redacted) reply on the outbound stream for the bridge.
-- KEYS[1] = gm:outbound  (stream)  replies, read by the grid bridge
-- ARGV[1] = avatar UUID (canonical)
-- ARGV[2] = channel: public or im
-- ARGV[3] = text (already redacted and bounded, as stored)
-- ARGV[4] = in_reply_to: the inbound entry ID answered
-- ARGV[5] = session ID
-- ARGV[6] = max_entries (approximate MAXLEN: the bridge reads as they come)
-- Returns: the outbound entry's ID
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local args = new_args()

local uuid = args:str('avatar_uuid', ARGV[1], UUID_PATTERN)
local channel = args:str('channel', ARGV[2], '^%l+$')
if TTL_MS[channel] == nil then args:fail('channel') end
local text = ARGV[3] or ''
local in_reply_to = args:str('in_reply_to', ARGV[4], '^%d+%-%d+$')
local sid = args:str('session_id', ARGV[5], SESSION_ID_PATTERN)
local max_entries = args:int('max_entries', ARGV[6], 1)
local err = args:error()
if err then return err end

return redis.call('XADD', KEYS[1], 'MAXLEN', '~', max_entries, '*', 'avatar_uuid', uuid,
  'channel', channel, 'text', text, 'in_reply_to', in_reply_to, 'session_id', sid)
