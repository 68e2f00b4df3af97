-- finish_entry: an inbound entry is done: acknowledge it, delete it, and hand over the next one.
-- Deleting the entry means residents' raw words do not stay in the inbound stream
-- once answered (the store keeps only redacted text). Its attempts counter and
-- rejection record go with it. With a member, the entry leaves that key's
-- mailbox; the owner keeps the lease and sees the next entry (as claim_key shows
-- it: no attempt is counted), or releases the key when asked to (shutting down)
-- or when nothing is waiting.
-- KEYS[1] = gm:inbound              (stream)  inbound entries
-- KEYS[2] = {gm:inbound}:ready      (set)     keys with entries waiting
-- KEYS[3] = {gm:inbound}:attempts   (hash)    entry ID -> '<attempts>:<with a word>:<last token>'
-- KEYS[4] = {gm:inbound}:rejected   (hash)    entry ID -> dead-letter reason decided for it
-- ARGV[1] = group name
-- ARGV[2] = entry ID
-- ARGV[3] = member '<uuid>:<channel>', '' for an entry filed nowhere (dead-lettered)
-- ARGV[4] = owner: this worker's name
-- ARGV[5] = lease_ms (>= 1)
-- ARGV[6] = release (0|1): give the key up even if entries wait
-- Returns: {'ok', next_entry_id, ended_attempts, silent_attempts, rejected_reason or ''}
--          (still owned; as claim_key), {'empty'}, {'released'},
--          {'done'} (no member), {'lost'} (the lease had passed to another worker,
--          which answers the rest)
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument
-- The key's mailbox and owner lease are named by mailbox_keys(), inside KEYS[2]'s hash tag.

local args = new_args()

local group = args:str('group', ARGV[1], '^[%w%-_.:]+$')
local id = args:str('entry_id', ARGV[2], '^%d+%-%d+$')
local member = ''
if ARGV[3] ~= '' then member = args:member('member', ARGV[3]) end
local owner = args:str('owner', ARGV[4], '^[%w%-_.:]+$')
local lease = args:int('lease_ms', ARGV[5], 1)
local release = args:int('release', ARGV[6], 0, 1)
local err = args:error()
if err then return err end

redis.call('XACK', KEYS[1], group, id)
redis.call('XDEL', KEYS[1], id)
redis.call('HDEL', KEYS[3], id)
redis.call('HDEL', KEYS[4], id)
if member == '' then return { 'done' } end
local mailbox, owner_key = mailbox_keys(shard_prefix(KEYS[2]), member)
redis.call('LREM', mailbox, 1, id)
if redis.call('GET', owner_key) ~= owner then return { 'lost' } end
local head = redis.call('LINDEX', mailbox, 0)
if not head then
  redis.call('DEL', owner_key)
  redis.call('SREM', KEYS[2], member)
  return { 'empty' }
end
if release == 1 then
  redis.call('DEL', owner_key)
  return { 'released' }
end
redis.call('PEXPIRE', owner_key, lease)
local ended, silent = peek_attempts(KEYS[3], head, '')
return { 'ok', head, ended, silent, redis.call('HGET', KEYS[4], head) or '' }
