-- claim_key: take the lease on one conversation key and get its oldest waiting entry.
-- One worker at a time answers a key, oldest entry first; the lease expires if
-- that worker dies, and any worker may then claim the key. Every claim that
-- hands out the head starts an attempt at it, counted here in the same step
-- (count_attempt in lib.lua), so attempts survive adoptions and worker restarts
-- and the worker can dead-letter an entry that keeps failing (reason poison).
-- KEYS[1] = {gm:inbound}:ready     (set)   keys with entries waiting
-- KEYS[2] = {gm:inbound}:attempts  (hash)  entry ID -> '<attempts>:<token of the last attempt>'
-- ARGV[1] = member '<uuid>:<channel>'
-- ARGV[2] = owner: this worker's name
-- ARGV[3] = lease_ms (>= 1)
-- ARGV[4] = token: names this attempt; the token already counted for the head counts nothing
-- ARGV[5] = also: '' or an earlier token of this worker, whose attempt this one resumes
--           uncounted (after a connection fault)
-- Returns: {'ok', entry_id, attempts} (now owned by this worker; attempts >= 1 counts this one),
--          {'busy'} (another worker owns it), {'empty'} (nothing waiting; the key leaves the
--          ready set)
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument
-- The key's mailbox and owner lease are named by mailbox_keys(), inside KEYS[1]'s hash tag.

local member = arg_member('member', ARGV[1])
local owner = arg_str('owner', ARGV[2], '^[%w%-_.:]+$')
local lease = arg_int('lease_ms', ARGV[3], 1)
local token = arg_str('token', ARGV[4], '^[%w%-_.:]+$')
local also = ''
if ARGV[5] ~= '' then also = arg_str('also', ARGV[5], '^[%w%-_.:]+$') end
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
return { 'ok', head, count_attempt(KEYS[2], head, token, also) }
