-- list_metadata: one page of live sessions' metadata, ordered by (UUID, channel). Never content.
-- Read-only. The cursor is the last member of the previous page (exclusive), so
-- a session that exists for the whole walk is listed exactly once, however busy it is.
-- Idle-expired sessions not yet swept are skipped, so a page may hold fewer than
-- `limit` items; only an empty next cursor means the end.
-- KEYS[1] = gm:{shard}:sessions    (zset)  every session, score 0
-- KEYS[2] = gm:{shard}:lru:public  (zset)  last activity, public sessions
-- KEYS[3] = gm:{shard}:lru:im      (zset)  last activity, IM sessions
-- KEYS[4] = gm:{shard}:clock       (hash)  clock domain
-- ARGV[1] = now_mono (integer ms)
-- ARGV[2] = now_wall (integer ms)
-- ARGV[3] = boot_id
-- ARGV[4] = after: member '<uuid>:<channel>' of the previous page's end, '' to start
-- ARGV[5] = limit (1..1000)
-- Returns: {next_after ('' at the end), {member, session_id, created_ms, active_ms, turns, bytes}, ...}
-- Flags:   no-writes (read-only; runs even while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument
-- Reads each listed session's meta hash by name (session_keys), inside this shard's hash tag.

local args = new_args()

local mono, wall, boot = args:clock(ARGV[1], ARGV[2], ARGV[3])
local after = ''
if ARGV[4] ~= '' then after = args:member('after', ARGV[4]) end
local limit = args:int('limit', ARGV[5], 1, 1000)
local err = args:error()
if err then return err end

local start = '-'
if after ~= '' then start = '(' .. after end
local members = redis.call('ZRANGEBYLEX', KEYS[1], start, '+', 'LIMIT', 0, limit + 1)
local next_after = ''
if #members > limit then
  members[#members] = nil
  next_after = members[#members]
end

local now = store_now(KEYS[4], boot, mono, wall, false)
local prefix = shard_prefix(KEYS[1])
local lru = { public = KEYS[2], im = KEYS[3] }
local reply = {next_after}
for _, m in ipairs(members) do
  local _, channel = split_member(m)
  if channel and not is_expired(lru[channel], m, channel, now) then
    local meta = redis.call('HMGET', session_keys(prefix, m)[1], 'sid', 'created', 'active', 'turns', 'bytes')
    if meta[1] then
      reply[#reply + 1] = {m, meta[1], meta[2] or '0', meta[3] or '0', meta[4] or '0', meta[5] or '0'}
    end
  end
end
return reply
