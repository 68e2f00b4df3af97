-- mark_restored: read or set the marker saying this store was restored from a snapshot.
-- The marker lives only as long as the server's data: after a server restart
-- (which keeps nothing) it is gone, and the next start restores again.
-- KEYS[1] = gm:{0}:restored  (string)  generation number restored
-- ARGV[1] = generation to record, or '' to only read the marker
-- Returns: the marker's value before this call, '' if unset
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local args = new_args()

local generation = ''
if ARGV[1] ~= '' then generation = args:str('generation', ARGV[1], '^%d+$') end
local err = args:error()
if err then return err end

local before = redis.call('GET', KEYS[1]) or ''
if generation ~= '' then redis.call('SET', KEYS[1], generation) end
return before
