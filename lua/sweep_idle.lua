-- sweep_idle: expire up to `batch` sessions idle for at least their channel's TTL.
-- Frees memory when nobody writes. Oldest activity first, public then IM.
-- KEYS: the shard scripts' layout without a session (lib.lua Args:shard_keys), read by name:
-- KEYS[1] = gm:{shard}:lru:public  (zset)    last activity, public sessions
-- KEYS[2] = gm:{shard}:lru:im      (zset)    last activity, IM sessions
-- KEYS[3] = gm:{shard}:sessions    (zset)    every session
-- KEYS[4] = gm:{shard}:seq         (string)  sequence counter (unused here)
-- KEYS[5] = gm:{shard}:clock       (hash)    clock domain
-- KEYS[6] = gm:{shard}:events      (stream)  events
-- KEYS[7] = gm:{shard}:stats       (hash)    bytes: the shard's stored bytes
-- ARGV[1] = now_mono (integer ms)
-- ARGV[2] = now_wall (integer ms)
-- ARGV[3] = boot_id
-- ARGV[4] = batch: most sessions to expire in this call (1..1000)
-- ARGV[5] = max_events
-- Returns: number of sessions expired (event expired_inactivity each)
-- Flags:   allow-oom (it frees memory, so it must run when the server is full)
-- Errors:  "GM_BADARG <field>" on a malformed argument, "GM_BADARG keys" on KEYS
--          not in the layout (nothing written either way)
-- Victims' keys are named by session_keys() inside this shard's hash tag.

local args = new_args()

local keys = args:shard_keys(KEYS, false)
local mono, wall, boot = args:clock(ARGV[1], ARGV[2], ARGV[3])
local batch = args:int('batch', ARGV[4], 1, 1000)
local max_events = args:int('max_events', ARGV[5], 1)
local err = args:error()
if err then return err end

local shard = shard_context(keys, max_events, wall)
local now = store_now(keys.clock, boot, mono, wall, true)
return expire_idle(shard, now, batch)
