-- publish_limits: record what one shard runs with, for bin/gridmem-cli (DESIGN section 12):
-- the configured limits, the shard's place in the layout and the bounds its
-- scripts apply (the event stream's MAXLEN, the read scripts' largest page), so
-- the CLI reads them here instead of repeating them. Replaces the hash whole.
-- KEYS[1] = gm:{shard}:limits  (hash)  name -> value
-- ARGV[1..] = name, value pairs; names are lowercase words, values integers >= 0
-- Returns: the number of limits recorded
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local args = new_args()

if #ARGV == 0 or #ARGV % 2 ~= 0 then args:fail('limits') end
for i = 1, #ARGV, 2 do
  args:str('limit', ARGV[i], '^[%l_]+$')
  args:int(ARGV[i] or 'limit', ARGV[i + 1], 0)
end
local err = args:error()
if err then return err end

redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV))
return #ARGV / 2
