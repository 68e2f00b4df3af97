-- publish_layout: record where a store's keys live, in the namespace's layout hash
-- that bin/gridmem-cli starts from (DESIGN section 12): the CLI reads every shard's
-- key prefix here instead of re-encoding the key layout.
-- Publishing again replaces the entry.
-- KEYS[1] = gm:layout  (hash)  namespace -> its shards' key prefixes, space-separated
-- ARGV[1] = namespace (lowercase letters, digits, _ and -; 1-32)
-- ARGV[2..] = the key prefix of shard 0, 1, ...: '<namespace>:{<tag>}:' each
-- Returns: the number of shards recorded
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument; "GM_BADARG key" when KEYS[1] is
--          not '<namespace>:layout'

local args = new_args()

local namespace = args:str('namespace', ARGV[1], '^[%l%d_%-]+$')
if #namespace > 32 then args:fail('namespace') end
if #ARGV < 2 then args:fail('prefixes') end
local prefixes = {}
for i = 2, #ARGV do
  -- the namespace, then one hash tag: a prefix can name no key outside its store
  local prefix = args:str('prefix', ARGV[i], '^[%l%d_%-]+:{[^{}%s]+}:$')
  if string.sub(prefix, 1, #namespace + 1) ~= namespace .. ':' then
    args:fail('prefix')
  end
  prefixes[#prefixes + 1] = prefix
end
-- the layout lives inside its namespace, as every key does (DESIGN section 3)
if KEYS[1] ~= namespace .. ':layout' then args:fail('key') end
local err = args:error()
if err then return err end

redis.call('HSET', KEYS[1], namespace, table.concat(prefixes, ' '))
return #prefixes
