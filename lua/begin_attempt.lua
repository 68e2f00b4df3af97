-- begin_attempt: count one attempt at the entry a worker is about to answer.
-- Counted when the attempt really starts (after the worker's gate, see
-- service.py), not when the key is claimed: an entry that waits in a worker
-- for a suspect to finish alone is not charged if that suspect kills the process.
-- The count survives adoptions and worker restarts, so an entry that keeps failing
-- or killing its worker can be dead-lettered (reason poison). It also returns the
-- entry's fields, every pair as stored, so starting an attempt is one round trip:
-- the clients' XRANGE reply parsers would fold a field named twice into its last
-- value, and the worker decodes every value strictly.
-- KEYS[1] = {gm:inbound}:ready     (set)   keys with entries waiting (names the hash tag)
-- KEYS[2] = {gm:inbound}:attempts  (hash)  entry ID -> '<attempts>:<with a word>:<last token>'
-- KEYS[3] = gm:inbound             (stream) inbound entries (the same slot)
-- ARGV[1] = member '<uuid>:<channel>'
-- ARGV[2] = owner: this worker's name
-- ARGV[3] = entry ID: the key's head
-- ARGV[4] = token: names this attempt; a resend of the counted token counts nothing
-- ARGV[5] = also: '' or this worker's attempt in hand before a connection fault: resumed
--           under `token`, uncounted
-- ARGV[6] = failed: '' or the token of this worker's previous attempt, which raised (it
--           ended with a word)
-- Returns: {'ok', attempts (this one included), silent (earlier ones that ended without a
--          word), {field, value, ...} (the entry as stored, undecoded bytes; {} if it is
--          gone)}, or {'lost'} (the lease passed to another worker: start nothing)
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument
-- The key's owner lease is named by mailbox_keys(), inside KEYS[1]'s hash tag.

local args = new_args()

local member = args:member('member', ARGV[1])
local owner = args:str('owner', ARGV[2], '^[%w%-_.:]+$')
local id = args:str('entry_id', ARGV[3], '^%d+%-%d+$')
local token = args:str('token', ARGV[4], '^[%w%-_.]+$')
local also, failed = '', ''
if ARGV[5] ~= '' then also = args:str('also', ARGV[5], '^[%w%-_.]+$') end
if ARGV[6] ~= '' then failed = args:str('failed', ARGV[6], '^[%w%-_.]+$') end
local err = args:error()
if err then return err end

local _, owner_key = mailbox_keys(shard_prefix(KEYS[1]), member)
if redis.call('GET', owner_key) ~= owner then return { 'lost' } end
local attempts, silent = count_attempt(KEYS[2], id, token, also, failed)
local found = redis.call('XRANGE', KEYS[3], id, id)
local fields = {}
if #found > 0 then fields = found[1][2] end
return { 'ok', attempts, silent, fields }
