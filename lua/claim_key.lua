-- claim_key: take the lease on one conversation key and get its oldest waiting entry.
-- One worker at a time answers a key, oldest entry first; the lease expires if
-- that worker dies, and any worker may then claim the key.
-- KEYS[1] = {gm:inbound}:ready  (set)  keys with entries waiting
-- ARGV[1] = member '<uuid>:<channel>'
-- ARGV[2] = owner: this worker's name
-- ARGV[3] = lease_ms (>= 1)
-- Returns: {'ok', entry_id} (now owned by this worker), {'busy'} (another worker owns it),
--          {'empty'} (nothing waiting; the key leaves the ready set)
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument
-- The key's mailbox and owner lease are named by mailbox_keys(), inside KEYS[1]'s hash tag.

local member = arg_member('member', ARGV[1])
local owner = arg_str('owner', ARGV[2], '^[%w%-_.:]+$')
local lease = arg_int('lease_ms', ARGV[3], 1)
local err = arg_error()
if err then return err end

local mailbox, owner_key = mailbox_keys(shard_prefix(KEYS[1]), member)
local current = redis.call('GET', owner_key)
if current and current ~= owner then return { 'busy' } end
local head = redis.call('LINDEX', mailbox, 0)
if not head then
  if current then redis.call('DEL', owner_key) end
  redis.call('SREM', KEYS[1], member)
  return { 'empty' }
end
redis.call('SET', owner_key, owner, 'PX', lease)
return { 'ok', head }
