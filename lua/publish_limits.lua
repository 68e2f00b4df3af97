-- publish_limits: record what one shard runs with, for bin/gridmem-cli (DESIGN section 12):
-- the configured limits, the shard's place in the layout and the bounds its
-- scripts apply (the event stream's MAXLEN, the read scripts' largest page), so
-- the CLI reads them here instead of repeating them, and the shard's key names
-- (gridmem/keys.py KeySpace.templates), so the CLI builds none. Replaces the hash whole.
-- KEYS[1] = gm:{shard}:limits  (hash)  name -> value
-- ARGV[1..] = name, value pairs; names are lowercase words, values integers >= 0,
--             except a key_<name> field's: a key name or template (no spaces; <uuid>
--             and <channel> mark where a session's UUID and channel go)
-- Returns: the number of limits recorded
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local args = new_args()

if #ARGV == 0 or #ARGV % 2 ~= 0 then args:fail('limits') end
for i = 1, #ARGV, 2 do
  args:str('limit', ARGV[i], '^[%l_]+$')
  if string.sub(ARGV[i] or '', 1, 4) == 'key_' then
    args:str(ARGV[i], ARGV[i + 1], '^[%w_%-:{}<>]+$')
  else
    args:int(ARGV[i] or 'limit', ARGV[i + 1], 0)
  end
end
local err = args:error()
if err then return err end

redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV))
return #ARGV / 2
