-- renew_lease: keep owning a conversation key while its entry is being answered.
-- KEYS[1] = {gm:inbound}:ready  (set)  keys with entries waiting (names the hash tag)
-- ARGV[1] = member '<uuid>:<channel>'
-- ARGV[2] = owner: this worker's name
-- ARGV[3] = lease_ms (>= 1)
-- Returns: 1 if renewed, 0 if this worker no longer owns the key
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument
-- The key's owner lease is named by mailbox_keys(), inside KEYS[1]'s hash tag.

local args = new_args()

local member = args:member('member', ARGV[1])
local owner = args:str('owner', ARGV[2], '^[%w%-_.:]+$')
local lease = args:int('lease_ms', ARGV[3], 1)
local err = args:error()
if err then return err end

local _, owner_key = mailbox_keys(shard_prefix(KEYS[1]), member)
if redis.call('GET', owner_key) ~= owner then return 0 end
redis.call('PEXPIRE', owner_key, lease)
return 1
