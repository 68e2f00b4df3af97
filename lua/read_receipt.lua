-- read_receipt: the receipt kept for an idempotency key in a live session, if any.
-- Read-only. The worker service asks it when a redelivered message was already
-- recorded: was the reply recorded too?
-- KEYS[1] = gm:{shard}:s:<uuid>:<ch>:meta  (hash)  session metadata
-- KEYS[2] = gm:{shard}:s:<uuid>:<ch>:idem  (hash)  idempotency key -> receipt
-- KEYS[3] = gm:{shard}:lru:<ch>            (zset)  last activity
-- KEYS[4] = gm:{shard}:clock               (hash)  clock domain
-- ARGV[1] = now_mono (integer ms)
-- ARGV[2] = now_wall (integer ms)
-- ARGV[3] = boot_id
-- ARGV[4] = member '<uuid>:<channel>'
-- ARGV[5] = idempotency key
-- Returns: {session_id, 'seq:new:redactions:truncated'}, or {'', ''} if none
-- Flags:   no-writes (read-only; runs even while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local args = new_args()

local mono, wall, boot = args:clock(ARGV[1], ARGV[2], ARGV[3])
local member, _, channel = args:member('member', ARGV[4])
local key = args:str('idempotency_key', ARGV[5], '^[%w%-_.:]+$')
local err = args:error()
if err then return err end

local sid = redis.call('HGET', KEYS[1], 'sid')
if not sid then return { '', '' } end
local now = store_now(KEYS[4], boot, mono, wall, false)
if is_expired(KEYS[3], member, channel, now) then return { '', '' } end
local receipt = redis.call('HGET', KEYS[2], key)
if not receipt then return { '', '' } end
return { sid, receipt }
