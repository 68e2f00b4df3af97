-- sweep_idle: expire up to `batch` sessions idle for at least their channel's TTL.
-- Frees memory when nobody writes. Oldest activity first, public then IM.
-- KEYS[1] = gm:{shard}:lru:public  (zset)    last activity, public sessions
-- KEYS[2] = gm:{shard}:lru:im      (zset)    last activity, IM sessions
-- KEYS[3] = gm:{shard}:sessions    (zset)    every session
-- KEYS[4] = gm:{shard}:clock       (hash)    clock domain
-- KEYS[5] = gm:{shard}:events      (stream)  events
-- KEYS[6] = gm:{shard}:stats       (hash)    bytes: the shard's stored bytes
-- ARGV[1] = now_mono (integer ms)
-- ARGV[2] = now_wall (integer ms)
-- ARGV[3] = boot_id
-- ARGV[4] = batch: most sessions to expire in this call (1..1000)
-- ARGV[5] = max_events
-- Returns: number of sessions expired (event expired_inactivity each)
-- Flags:   allow-oom (it frees memory, so it must run when the server is full)
-- Errors:  "GM_BADARG <field>" on a malformed argument
-- Victims' keys are named by session_keys() inside this shard's hash tag.

local args = new_args()

local mono, wall, boot = args:clock(ARGV[1], ARGV[2], ARGV[3])
local batch = args:int('batch', ARGV[4], 1, 1000)
local max_events = args:int('max_events', ARGV[5], 1)
local err = args:error()
if err then return err end

local shard = shard_context({
  lru_public = KEYS[1], lru_im = KEYS[2], sessions = KEYS[3], events = KEYS[5], stats = KEYS[6],
}, max_events, wall)
local now = store_now(KEYS[4], boot, mono, wall, true)
return expire_idle(shard, now, batch)
