-- read_context: everything the LLM may see of one session: summary and live records.
-- Read-only: reading never counts as activity, and an idle-expired session reads as empty.
-- KEYS[1] = gm:{shard}:s:<uuid>:<ch>:meta     (hash)   session metadata
-- KEYS[2] = gm:{shard}:s:<uuid>:<ch>:turns    (zset)   score = seq
-- KEYS[3] = gm:{shard}:s:<uuid>:<ch>:summary  (string) factual summary
-- KEYS[4] = gm:{shard}:lru:<ch>               (zset)   last activity
-- KEYS[5] = gm:{shard}:clock                  (hash)   clock domain
-- ARGV[1] = now_mono (integer ms)
-- ARGV[2] = now_wall (integer ms)
-- ARGV[3] = boot_id
-- ARGV[4] = member '<uuid>:<channel>'
-- Returns: {session_id, summary, {record, record, ...}} records oldest first;
--          {'', '', {}} when there is no live session
-- Flags:   no-writes (read-only; runs even while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local mono, wall, boot = arg_clock(ARGV[1], ARGV[2], ARGV[3])
local member, _, channel = arg_member('member', ARGV[4])
local err = arg_error()
if err then return err end

local sid = redis.call('HGET', KEYS[1], 'sid')
if not sid then return {'', '', {}} end
local now = store_now(KEYS[5], boot, mono, wall, false)
if is_expired(KEYS[4], member, channel, now) then return {'', '', {}} end

return {sid, redis.call('GET', KEYS[3]) or '', redis.call('ZRANGE', KEYS[2], 0, -1)}
