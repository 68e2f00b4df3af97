-- lib.lua: helpers shared by every gridmem script.
-- The loader (worker/scripts.py, bin/gridmem-cli) prepends this file once to each
-- script, so everything here is a local of that script. Nothing here touches a
-- key the script was not given in KEYS, except session_keys(), which names an
-- expiry/eviction victim (or a listed session) inside the same hash tag.
-- Errors: helpers never raise; arg_* remember the first bad field and the
-- script returns arg_error() before its first write.

-- Inactivity TTLs, exact (DESIGN section 4); worker/records.py CHANNEL_TTL_MS must agree.
local TTL_MS = { public = 1800000, im = 86400000 }
-- Parts of a session, in the order of worker/keys.py SESSION_PARTS.
local SESSION_PARTS = { 'meta', 'turns', 'idem', 'summary', 'archive' }
local H = '[0-9a-f]'
local MEMBER_PATTERN = '^(' .. string.rep(H, 8) .. '%-' .. string.rep(H, 4) .. '%-' .. string.rep(H, 4)
  .. '%-' .. string.rep(H, 4) .. '%-' .. string.rep(H, 12) .. '):(%l+)$'
-- A session ID: 128 bits as 32 lowercase hex digits.
local SESSION_ID_PATTERN = '^' .. string.rep(H, 32) .. '$'

local bad_field = nil

local function arg_int(name, raw, lo, hi)
  local n = tonumber(raw)
  if n == nil or n ~= math.floor(n) or n < lo or (hi ~= nil and n > hi) then
    bad_field = bad_field or name
    return lo
  end
  return n
end

local function arg_str(name, raw, pattern)
  if raw == nil or string.match(raw, pattern) == nil then
    bad_field = bad_field or name
    return ''
  end
  return raw
end

-- A session member '<uuid>:<channel>'; returns member, uuid, channel.
local function arg_member(name, raw)
  local uuid, channel = string.match(raw or '', MEMBER_PATTERN)
  if uuid == nil or TTL_MS[channel] == nil then
    bad_field = bad_field or name
    return '', '', 'public'
  end
  return raw, uuid, channel
end

local function arg_error()
  if bad_field then
    return redis.error_reply('GM_BADARG ' .. bad_field)
  end
  return nil
end

local function split_member(member)
  return string.match(member, MEMBER_PATTERN)
end

-- The store's clock domain. Monotonic readings only compare within one boot, so
-- the store keeps an offset per shard: store time = caller's monotonic ms + offset.
-- When a caller from another boot arrives, the offset is re-based so that store
-- time moves on from the last write by the wall-clock time elapsed since it
-- (a wall clock that went backwards counts as no time). Returns store now (ms).
local function store_now(clock_key, boot, mono, wall, persist)
  local c = redis.call('HMGET', clock_key, 'boot', 'offset', 'last', 'wall')
  local offset = tonumber(c[2]) or 0
  local last = tonumber(c[3])
  if c[1] and c[1] ~= boot then
    local gap = wall - (tonumber(c[4]) or wall)
    if gap < 0 then gap = 0 end
    offset = (last or 0) + gap - mono
  end
  local now = mono + offset
  if persist then
    if last == nil or now > last then last = now end
    redis.call('HSET', clock_key, 'boot', boot, 'offset', offset, 'last', last, 'wall', wall)
  end
  return now
end

-- 'gm:{0}:lru:public' -> 'gm:{0}:' : the shard's prefix, hash tag included.
local function shard_prefix(shard_key)
  return string.match(shard_key, '^(.*}:)')
end

-- Key names of the session `member` in the shard whose prefix is `prefix`.
local function session_keys(prefix, member)
  local base = prefix .. 's:' .. member .. ':'
  local keys = {}
  for i, part in ipairs(SESSION_PARTS) do
    keys[i] = base .. part
  end
  return keys
end

-- Publish an event: stable reason code plus counts, never content. Exact MAXLEN.
local function emit(events_key, max_events, reason, wall, sid, member, ...)
  local uuid, channel = split_member(member)
  redis.call('XADD', events_key, 'MAXLEN', max_events, '*',
    'reason', reason, 'at', wall, 'sid', sid, 'uuid', uuid, 'ch', channel, ...)
end

-- Remove one session whole: its keys (part_keys, in SESSION_PARTS order), its
-- index entries, and publish `reason`. Returns 1 if it existed, else 0.
local function end_session(part_keys, member, lru_key, sessions_key, events_key, max_events, reason, wall)
  local meta = redis.call('HMGET', part_keys[1], 'sid', 'turns', 'bytes')
  redis.call('DEL', unpack(part_keys))
  redis.call('ZREM', lru_key, member)
  redis.call('ZREM', sessions_key, member)
  if not meta[1] then
    return 0
  end
  emit(events_key, max_events, reason, wall, meta[1], member,
    'turns', tonumber(meta[2]) or 0, 'bytes', tonumber(meta[3]) or 0)
  return 1
end

-- The index of `channel` among the two LRU keys given as (public, im).
local function lru_for(channel, lru_public, lru_im)
  if channel == 'public' then return lru_public end
  return lru_im
end

-- Is the session `member` (last activity = its LRU score) expired at store time `now`?
-- A session without an LRU entry is treated as expired: it cannot be kept alive.
local function is_expired(lru_key, member, channel, now)
  local last = tonumber(redis.call('ZSCORE', lru_key, member))
  return last == nil or now - last >= TTL_MS[channel], last
end

-- Common ARGV prefix of time-aware scripts: now_mono, now_wall, boot_id.
local function arg_clock(a1, a2, a3)
  local mono = arg_int('now_mono', a1, 0)
  local wall = arg_int('now_wall', a2, 0)
  local boot = arg_str('boot_id', a3, '^[%w%-_.]+$')
  return mono, wall, boot
end
