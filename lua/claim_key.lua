-- claim_key: take the lease on one conversation key and see its oldest waiting entry.
-- One worker at a time answers a key, oldest entry first; the lease expires if
-- that worker dies, and any worker may then claim the key. The claim says how
-- many attempts at the head have ended, how many of those ended without a word
-- (their worker died or stalled: the entry is a suspect, run alone), and the
-- reason a worker already decided to reject it with, if one did before dying.
-- It counts no attempt unless asked to begin one (`begin`: the worker holds a
-- free slot of its gate for it, so the attempt really starts now), and then only
-- at an ordinary head: no rejection decided, no attempt ended without a word,
-- fewer than `max_attempts` ended. That attempt is counted and the entry read as
-- begin_attempt would (one round trip instead of two, issue 16).
-- KEYS[1] = {gm:inbound}:ready     (set)    keys with entries waiting
-- KEYS[2] = {gm:inbound}:attempts  (hash)   entry ID -> '<attempts>:<with a word>:<last token>'
-- KEYS[3] = {gm:inbound}:rejected  (hash)   entry ID -> dead-letter reason decided for it
-- KEYS[4] = gm:inbound             (stream) inbound entries (the same slot)
-- ARGV[1] = member '<uuid>:<channel>'
-- ARGV[2] = owner: this worker's name
-- ARGV[3] = lease_ms (>= 1)
-- ARGV[4] = also: '' or the token of this worker's attempt in hand (after a connection
--           fault), which has not ended
-- ARGV[5] = begin: '' or the token to count an attempt at an ordinary head under
-- ARGV[6] = max_attempts (>= 1): with begin, a head with that many ended attempts is
--           not begun (the worker dead-letters it)
-- Returns: {'ok', entry_id, ended_attempts, silent_attempts, rejected_reason or ''} (now owned
--          by this worker), with begin and an ordinary head followed by attempts (this one
--          included), silent (earlier ones that ended without a word) and {field, value, ...}
--          (the entry as stored, undecoded; {} if it is gone), as begin_attempt returns
--          them; {'busy'} (another worker owns it), {'empty'} (nothing waiting; the key
--          leaves the ready set)
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument
-- The key's mailbox and owner lease are named by mailbox_keys(), inside KEYS[1]'s hash tag.

local args = new_args()

local member = args:member('member', ARGV[1])
local owner = args:str('owner', ARGV[2], '^[%w%-_.:]+$')
local lease = args:int('lease_ms', ARGV[3], 1)
local also = ''
if ARGV[4] ~= '' then also = args:str('also', ARGV[4], '^[%w%-_.]+$') end
local begin = ''
if ARGV[5] ~= '' then begin = args:str('begin', ARGV[5], '^[%w%-_.]+$') end
local max_attempts = args:int('max_attempts', ARGV[6], 1)
local err = args:error()
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
-- the attempt this very claim began, when it is a resend, is in hand, not ended
local ended, silent = peek_attempts(KEYS[2], head, also, begin)
local rejected = redis.call('HGET', KEYS[3], head) or ''
if begin == '' or rejected ~= '' or silent > 0 or ended >= max_attempts then
  return { 'ok', head, ended, silent, rejected }
end
local attempts, silent_now = count_attempt(KEYS[2], head, begin, also, '')
local found = redis.call('XRANGE', KEYS[4], head, head)
local fields = {}
if #found > 0 then fields = found[1][2] end
return { 'ok', head, ended, silent, rejected, attempts, silent_now, fields }
