-- read_inbound: the fields of one inbound entry, every pair as stored.
-- Read-only. A script rather than a plain XRANGE: the clients' XRANGE reply parsers fold
-- a field named twice into its last value, and the worker decodes every value strictly.
-- KEYS[1] = gm:inbound  (stream)  inbound entries
-- ARGV[1] = entry ID
-- Returns: {field, value, ...} as stored (undecoded bytes), or {} if the entry is gone
-- Flags:   no-writes (read-only; runs even while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local args = new_args()

local id = args:str('entry_id', ARGV[1], '^%d+%-%d+$')
local err = args:error()
if err then return err end

local found = redis.call('XRANGE', KEYS[1], id, id)
if #found == 0 then return {} end
return found[1][2]
