-- delete_session: remove one session whole on an operator's request.
-- The same change serves "delete" (deleted_operator) and "expire" (expired_operator);
-- only the published reason differs.
-- KEYS: the shard scripts' layout with a session (lib.lua Args:shard_keys), read by name:
-- KEYS[1]  = gm:{shard}:s:<uuid>:<ch>:meta     (hash)
-- KEYS[2]  = gm:{shard}:s:<uuid>:<ch>:turns    (zset)
-- KEYS[3]  = gm:{shard}:s:<uuid>:<ch>:idem     (hash)
-- KEYS[4]  = gm:{shard}:s:<uuid>:<ch>:summary  (string)
-- KEYS[5]  = gm:{shard}:s:<uuid>:<ch>:archive  (zset)
-- KEYS[6]  = gm:{shard}:lru:public             (zset)   last activity, public sessions
-- KEYS[7]  = gm:{shard}:lru:im                 (zset)   last activity, IM sessions
-- KEYS[8]  = gm:{shard}:sessions               (zset)   every session
-- KEYS[9]  = gm:{shard}:seq                    (string) sequence counter (unused here)
-- KEYS[10] = gm:{shard}:clock                  (hash)   clock domain (unused here)
-- KEYS[11] = gm:{shard}:events                 (stream) events
-- KEYS[12] = gm:{shard}:stats                  (hash)   bytes: the shard's stored bytes
-- ARGV[1]  = now_wall (integer ms), the event's time
-- ARGV[2]  = member '<uuid>:<channel>'
-- ARGV[3]  = reason: 'deleted_operator' or 'expired_operator'
-- ARGV[4]  = max_events
-- Returns: 1 if a session was removed (one event), 0 if there was none (no event)
-- Flags:   allow-oom (it frees memory, so it must run when the server is full)
-- Errors:  "GM_BADARG <field>" on a malformed argument, "GM_BADARG keys" on KEYS
--          not in the layout (nothing written either way)

local args = new_args()

local keys = args:shard_keys(KEYS, true)
local wall = args:int('now_wall', ARGV[1], 0)
local member = args:member('member', ARGV[2])
local reason = args:str('reason', ARGV[3], '^%l+_operator$')
if reason ~= REASON.deleted_operator and reason ~= REASON.expired_operator then args:fail('reason') end
local max_events = args:int('max_events', ARGV[4], 1)
local err = args:error()
if err then return err end

local shard = shard_context(keys, max_events, wall)
return end_session(shard, keys.own, member, reason)
