-- read_events: the next events of one shard's stream, oldest first.
-- Read-only. Events hold reason codes and counts, never content.
-- KEYS[1] = gm:{shard}:events  (stream)
-- ARGV[1] = after: stream ID of the last event seen (exclusive), '' for the oldest kept
-- ARGV[2] = count (1..10000)
-- Returns: {{id, field, value, field, value, ...}, ...}
-- Flags:   no-writes (read-only; runs even while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local args = new_args()

local after = ''
if ARGV[1] ~= '' then after = args:str('after', ARGV[1], '^%d+%-%d+$') end
local count = args:int('count', ARGV[2], 1, 10000)
local err = args:error()
if err then return err end

local start = '-'
if after ~= '' then start = '(' .. after end
local reply = {}
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', count)) do
  local row = {entry[1]}
  for _, v in ipairs(entry[2]) do row[#row + 1] = v end
  reply[#reply + 1] = row
end
return reply
