-- export_sessions: read a batch of live sessions whole, for a snapshot.
-- Read-only. Each session is read inside this one script, so it is a consistent
-- copy; a batch stops after `max_sessions` sessions or once `max_bytes` stored
-- bytes were read (at least one session), so no call blocks the server long.
-- Idle-expired sessions not yet swept are skipped.
-- KEYS[1] = gm:{shard}:sessions    (zset)  every session, score 0
-- KEYS[2] = gm:{shard}:lru:public  (zset)  last activity, public sessions
-- KEYS[3] = gm:{shard}:lru:im      (zset)  last activity, IM sessions
-- KEYS[4] = gm:{shard}:clock       (hash)  clock domain
-- ARGV[1] = now_mono (integer ms)
-- ARGV[2] = now_wall (integer ms)
-- ARGV[3] = boot_id
-- ARGV[4] = after: member '<uuid>:<channel>' of the previous batch's end, '' to start
-- ARGV[5] = max_sessions (1..1000)
-- ARGV[6] = max_bytes: stop the batch once this many stored bytes were read (>= 1)
-- Returns: {next_after ('' at the end),
--           {member, session_id, created_ms, active_ms, summary, {record, ...}, {key, receipt, ...},
--            archive segments ('first-last-bytes,...'), {archived record, ...} ({} without segments)}, ...}
-- Flags:   no-writes (read-only; runs even while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument
-- Reads each exported session's keys by name (session_keys), inside this shard's hash tag.

local args = new_args()

local mono, wall, boot = args:clock(ARGV[1], ARGV[2], ARGV[3])
local after = ''
if ARGV[4] ~= '' then after = args:member('after', ARGV[4]) end
local max_sessions = args:int('max_sessions', ARGV[5], 1, 1000)
local max_bytes = args:int('max_bytes', ARGV[6], 1)
local err = args:error()
if err then return err end

local start = '-'
if after ~= '' then start = '(' .. after end
local members = redis.call('ZRANGEBYLEX', KEYS[1], start, '+', 'LIMIT', 0, max_sessions)
local now = store_now(KEYS[4], boot, mono, wall, false)
local prefix = shard_prefix(KEYS[1])
local lru = { public = KEYS[2], im = KEYS[3] }
-- each member's channel and last activity: one ZMSCORE per channel for the batch,
-- not a ZSCORE per session (a fifth of the server calls of a flush)
local channels, last = {}, {}
for i, m in ipairs(members) do
  local _, channel = split_member(m)
  channels[i] = channel
end
for channel, key in pairs(lru) do
  local names, at = {}, {}
  for i, m in ipairs(members) do
    if channels[i] == channel then
      names[#names + 1] = m
      at[#at + 1] = i
    end
  end
  if #names > 0 then
    local scores = redis.call('ZMSCORE', key, unpack(names))
    for j, i in ipairs(at) do last[i] = tonumber(scores[j]) end -- none: false -> nil
  end
end
local reply = { '' }
local read = 0
for i, m in ipairs(members) do
  local channel = channels[i]
  local keys = session_keys(prefix, m)
  local meta = redis.call('HMGET', keys[1], 'sid', 'created', 'active', 'bytes', 'segments', 'abytes')
  if meta[1] and channel and not expired_at(last[i], channel, now) then
    -- archived entries count only inside a segment: with none, the archive is not read
    local segments = meta[5] or ''
    local archived = {}
    if segments ~= '' then archived = redis.call('ZRANGE', keys[5], 0, -1) end
    reply[#reply + 1] = {
      m, meta[1], meta[2] or '0', meta[3] or '0', redis.call('GET', keys[4]) or '',
      redis.call('ZRANGE', keys[2], 0, -1), redis.call('HGETALL', keys[3]),
      segments, archived,
    }
    read = read + (tonumber(meta[4]) or 0) + (tonumber(meta[6]) or 0)
  end
  if read >= max_bytes and i < #members then
    reply[1] = m -- stop early: the next batch starts after this member
    return reply
  end
end
if #members == max_sessions then reply[1] = members[#members] end
return reply
