-- orphaned_keys: conversation keys with entries waiting and no owner (its worker died or left).
-- Read-only. Sampled, so the call stays short however many keys wait.
-- KEYS[1] = {gm:inbound}:ready  (set)  keys with entries waiting
-- ARGV[1] = sample size (1..1000)
-- Returns: {member, ...} without an owner lease
-- Flags:   no-writes (read-only; runs even while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument
-- Owner leases are named by mailbox_keys(), inside KEYS[1]'s hash tag.

local args = new_args()

local sample = args:int('sample', ARGV[1], 1, 1000)
local err = args:error()
if err then return err end

local prefix = shard_prefix(KEYS[1])
local orphans = {}
for _, member in ipairs(redis.call('SRANDMEMBER', KEYS[1], sample)) do
  local _, owner_key = mailbox_keys(prefix, member)
  if redis.call('EXISTS', owner_key) == 0 then orphans[#orphans + 1] = member end
end
return orphans
