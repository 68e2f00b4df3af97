-- ensure_group: create the workers' consumer group on the inbound stream if it is missing.
-- A new group starts at the beginning of the stream: handled entries are deleted
-- as they are finished, so what is left there is still to be answered.
-- KEYS[1] = gm:inbound  (stream)  what residents said, written by the grid bridge
-- ARGV[1] = group name
-- Returns: 1 if the group was created, 0 if it existed
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local args = new_args()

local group = args:str('group', ARGV[1], '^[%w%-_.:]+$')
local err = args:error()
if err then return err end

local ok = pcall(redis.call, 'XGROUP', 'CREATE', KEYS[1], group, '0', 'MKSTREAM')
if ok then return 1 end
return 0
