-- lib.lua: helpers shared by every gridmem script.
-- The store runs every script as a function of one function library whose code
-- starts with this file (gridmem/scripts.py: FUNCTION LOAD once, then FCALL), so
-- this file runs once per load, not once per call; bin/gridmem-cli and the Lua
-- tests prepend it to a single script for EVAL instead. Either way everything
-- here is local to the scripts. State that must not outlive a call (which
-- argument was bad) is a value of the call: new_args().
-- Nothing here touches a key the script was not given in KEYS, except
-- session_keys(), which names an expiry/eviction victim (or a listed session)
-- inside the same hash tag.
-- Errors: helpers never raise; a script's argument checker (new_args) remembers
-- the first bad field and the script returns args:error() before its first write.
-- The constants shared with Python (TTL_MS, SESSION_PARTS, SHARD_PARTS, LIMIT_FIELDS,
-- MAX_BOOT_ID_CHARS, MAX_CLOCK_BOOTS, KIND_CODE, KIND_HEAD, REASON, DEAD) are not
-- written here: gridmem/library.py generates them into a prelude that precedes this file.
-- The scripts that keep a shard take one KEYS layout: see Args:shard_keys below.

-- UUID_BODY and SESSION_ID_BODY come from the prelude (gridmem/ids.py).
-- A canonical (lowercase) avatar UUID, and a session member '<uuid>:<channel>'.
local UUID_PATTERN = '^' .. UUID_BODY .. '$'
local MEMBER_PATTERN = '^(' .. UUID_BODY .. '):(%l+)$'
-- A session ID: 128 bits as 32 lowercase hex digits.
local SESSION_ID_PATTERN = '^' .. SESSION_ID_BODY .. '$'

-- ---------------------------------------------------------------- arguments

-- Every script reads its arguments through one checker of its own call:
--   local args = new_args()
--   local n = args:int('name', ARGV[i], lo, hi)   ... args:str, args:member, args:limits,
--                                                     args:clock, args:shard_keys
--   local err = args:error(); if err then return err end
-- A checker remembers the first bad field (args:fail(name) names one by hand);
-- being a value of the call, nothing of it outlives the call (a function library
-- keeps its file-level locals from one call to the next).
local Args = {}
Args.__index = Args

local function new_args()
  return setmetatable({ bad = nil }, Args)
end

function Args:fail(name)
  self.bad = self.bad or name
end

function Args:int(name, raw, lo, hi)
  local n = tonumber(raw)
  if n == nil or n ~= math.floor(n) or n < lo or (hi ~= nil and n > hi) then
    self:fail(name)
    return lo
  end
  return n
end

function Args:str(name, raw, pattern)
  if raw == nil or string.match(raw, pattern) == nil then
    self:fail(name)
    return ''
  end
  return raw
end

-- A session member '<uuid>:<channel>'; returns member, uuid, channel.
function Args:member(name, raw)
  local uuid, channel = string.match(raw or '', MEMBER_PATTERN)
  if uuid == nil or TTL_MS[channel] == nil then
    self:fail(name)
    return '', '', 'public'
  end
  return raw, uuid, channel
end

-- The last limits packet that parsed whole, and its table. A store sends the same
-- packet with every call, and parsing is a pure function of the packet, so the parse
-- is kept from one call to the next (a function library keeps its file-level locals):
-- a call with that exact packet reads the table instead of parsing it again. A packet
-- with a bad field is never kept, so every call with one fails as before. No script
-- writes into a limits table (it is shared by the calls that send that packet).
local limits_packet, limits_table = nil, nil

-- The limits packet: comma-separated integers >= 0, LIMIT_FIELDS (prelude) in order.
function Args:limits(name, raw)
  if raw ~= nil and raw == limits_packet then return limits_table end
  local limits, i, whole = {}, 0, true
  for part in string.gmatch(raw or '', '[^,]+') do
    i = i + 1
    local field = LIMIT_FIELDS[i]
    if field == nil then break end
    local n = tonumber(part)
    if n == nil or n ~= math.floor(n) or n < 0 then
      self:fail(name .. '.' .. field)  -- the name is built only for a bad field
      n, whole = 0, false
    end
    limits[field] = n
  end
  if i ~= #LIMIT_FIELDS then
    self:fail(name)
    for _, field in ipairs(LIMIT_FIELDS) do limits[field] = limits[field] or 0 end
  elseif whole then
    limits_packet, limits_table = raw, limits
  end
  return limits
end

-- Common ARGV prefix of time-aware scripts: now_mono, now_wall, boot_id.
-- A boot id names hash fields of the clock (store_now), so it is short
-- (MAX_BOOT_ID_CHARS, prelude; gridmem/reads.py check_clock is the same rule).
function Args:clock(a1, a2, a3)
  local mono = self:int('now_mono', a1, 0)
  local wall = self:int('now_wall', a2, 0)
  local boot = self:str('boot_id', a3, '^[%w%-_.]+$')
  if #boot > MAX_BOOT_ID_CHARS then self:fail('boot_id') end
  return mono, wall, boot
end

-- The one KEYS layout of every script that keeps a shard (record_turn, restore_session,
-- sweep_idle, delete_session), built by gridmem/session_calls.py shard_script_keys:
--   with a session:  KEYS[1..5]  = its keys, SESSION_PARTS order (meta, turns, idem,
--                                  summary, archive: gm:{shard}:s:<uuid>:<ch>:<part>)
--                    KEYS[6..12] = the shard's, SHARD_PARTS order (below)
--   without one:     KEYS[1..7]  = the shard's, SHARD_PARTS order: lru_public, lru_im,
--                                  sessions, seq, clock, events, stats (gm:{shard}:lru:public, ...)
-- Returns the keys by name (keys.meta, keys.clock, ...; keys.own lists the session's in
-- SESSION_PARTS order); a count other than the layout's fails 'keys'.
function Args:shard_keys(raw, with_session)
  local named, first = {}, 0
  if with_session then
    local own = {}
    for i = 1, #SESSION_PARTS do
      local key = raw[i]
      named[SESSION_PARTS[i]], own[i] = key, key
    end
    named.own, first = own, #SESSION_PARTS
  end
  for i = 1, #SHARD_PARTS do named[SHARD_PARTS[i]] = raw[first + i] end
  if #raw ~= first + #SHARD_PARTS then self:fail('keys') end
  return named
end

-- The reply for the first bad field, or nil: returned before the script's first write.
function Args:error()
  if self.bad then
    return redis.error_reply('GM_BADARG ' .. self.bad)
  end
  return nil
end

-- Byte-wise a < b. Lua's `<` on strings follows the server's locale (strcoll).
local function byte_less(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- ---------------------------------------------------------------- time

-- The store's clock domain (DESIGN section 4). Monotonic readings compare only
-- within one boot, so the shard's clock hash keeps an offset per boot id:
-- store time = the caller's monotonic ms + its boot's offset. A boot's offset is
-- fixed when it first writes, and never changes after that. It is fixed from
-- `epoch`, store time minus wall time, set once at the shard's first write: a new
-- boot starts at `wall + epoch`, or at the store's latest time (`last`) if that is
-- later (store time never goes backwards; a wall clock behind counts as no time).
-- A new boot's start depends only on its own wall clock and the fixed epoch, never
-- on which host wrote last, so skew never accumulates: with every wall clock
-- within d of the first writer's, store time stays within d of that writer's
-- wall-clock time, however many boots come and go (re-basing from the wall
-- clock of whichever host wrote `last` added the skew again at each new boot).
-- Fields: epoch; last, wall (the store's latest time and the wall clock that
-- wrote it: `wall` only derives an epoch for a hash older versions left without
-- one); o:<boot> (that boot's offset), s:<boot> (that boot's latest store time).
-- Only the MAX_CLOCK_BOOTS most recently seen boots are kept; a boot forgotten
-- and seen again is a new boot (its offset fixed again, from the epoch).
-- gridmem/reads.py live_now is this rule, read-only, in Python: keep them equal.
-- MAX_CLOCK_BOOTS comes from the prelude (gridmem/clock.py).

-- A stored clock field: a decimal integer, else nil (gridmem/reads.py clock_field).
local function clock_field(v)
  if v and string.find(v, '^%-?%d+$') then return tonumber(v) end
  return nil
end

-- Keep the MAX_CLOCK_BOOTS most recently seen boots (and always `keep`); forget
-- the rest, least recently seen first (ties: boot id byte order). Also drops the
-- single-offset fields of older versions ('boot', 'offset').
local function forget_old_boots(clock_key, keep)
  local fields = redis.call('HGETALL', clock_key)
  local seen, boots = {}, {}
  for i = 1, #fields, 2 do
    local kind, b = string.match(fields[i], '^([os]):(.+)$')
    if b and b ~= keep then
      if seen[b] == nil then
        seen[b] = -math.huge
        boots[#boots + 1] = b
      end
      if kind == 's' then seen[b] = clock_field(fields[i + 1]) or -math.huge end
    end
  end
  redis.call('HDEL', clock_key, 'boot', 'offset')
  if #boots < MAX_CLOCK_BOOTS then return end
  table.sort(boots, function(a, b)
    if seen[a] ~= seen[b] then return seen[a] < seen[b] end
    return byte_less(a, b)
  end)
  for i = 1, #boots - MAX_CLOCK_BOOTS + 1 do
    redis.call('HDEL', clock_key, 'o:' .. boots[i], 's:' .. boots[i])
  end
end

-- The shard's epoch (store time minus wall time): the stored one, else the one
-- an older version's `last` and `wall` imply, else nil.
local function clock_epoch(epoch, last, last_wall)
  if epoch ~= nil then return epoch end
  if last ~= nil and last_wall ~= nil then return last - last_wall end
  return nil
end

-- Store now (ms) for a caller of boot `boot` reading `mono` and `wall`. With
-- `persist` (writers), fixes the boot's offset if it has none and records the
-- boot, the store's latest time and (once) the epoch; readers persist nothing.
local function store_now(clock_key, boot, mono, wall, persist)
  local c = redis.call('HMGET', clock_key, 'last', 'wall', 'o:' .. boot, 'epoch')
  local last, last_wall, offset = clock_field(c[1]), clock_field(c[2]), clock_field(c[3])
  local stored_epoch = clock_field(c[4])
  local epoch = clock_epoch(stored_epoch, last, last_wall)
  local known = offset ~= nil
  if not known then
    local start = mono -- the first boot to write a shard: store time is its monotonic time
    if epoch ~= nil then
      start = wall + epoch
      if last ~= nil and last > start then start = last end
    elseif last ~= nil then
      start = last
    end
    offset = start - mono
  end
  local now = mono + offset
  if persist then
    local set = { 's:' .. boot, now }
    if last == nil or now > last then
      set[3] = 'last'
      set[4] = now
      set[5] = 'wall'
      set[6] = wall
    end
    if not known then
      set[#set + 1] = 'o:' .. boot
      set[#set + 1] = offset
    end
    if stored_epoch == nil then
      set[#set + 1] = 'epoch'
      set[#set + 1] = epoch or (now - wall)
    end
    redis.call('HSET', clock_key, unpack(set))
    if not known then forget_old_boots(clock_key, boot) end
  end
  return now
end

-- ---------------------------------------------------------------- sessions

local function split_member(member)
  return string.match(member, MEMBER_PATTERN)
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

-- The worker service's per-conversation keys, inside the inbound stream's hash tag
-- (prefix '{gm:inbound}:'): the mailbox (list of entry IDs, arrival order) and
-- the owner lease (string: the worker answering it).
local function mailbox_keys(prefix, member)
  return prefix .. 'mbox:' .. member, prefix .. 'owner:' .. member
end

-- Attempts at inbound entry `id`, kept in the attempts hash (field: the entry ID,
-- value '<attempts>:<ended with a word>:<token of the last attempt>'). An attempt
-- "ends with a word" when its worker reported it failed (it raised and the worker
-- tried again); any other earlier attempt ended without a word: its worker died,
-- was killed or stalled past its lease. Returns attempts, with a word, last token.
local function read_attempts(attempts, id)
  local seen = redis.call('HGET', attempts, id)
  if not seen then return 0, 0, '' end
  local n, w, last = string.match(seen, '^(%d+):(%d+):(.*)$')
  if n then return tonumber(n), math.min(tonumber(w), tonumber(n)), last end
  n, last = string.match(seen, '^(%d+):(.*)$')  -- written before the word count was kept
  return tonumber(n) or 0, 0, last or ''
end

-- What the key's owner needs to know before it starts an attempt at `id`, without
-- counting one: attempts that ended (the one named `also`, this worker's attempt
-- in hand before a connection fault, has not ended; nor has `mine`, the attempt a
-- resent claim_key began), and how many of those ended without a word. Returns
-- ended, silent.
local function peek_attempts(attempts, id, also, mine)
  local n, w, last = read_attempts(attempts, id)
  if last ~= '' and (last == also or last == mine) then n = n - 1 end
  return n, math.max(n - w, 0)
end

-- Count one more attempt at inbound entry `id`, unless it is counted already. A
-- worker names each attempt with a token of its own: a call that repeats the
-- counted token (a resend) counts nothing; `also` (an earlier token of the same
-- worker, or '') resumes the attempt it had in hand when Redis became
-- unreachable, renamed to `token`, uncounted; `failed` (the token of this
-- worker's previous attempt, which raised, or '') records that it ended with a
-- word. So connection faults never add up to poison; new tries, and adoptions of
-- a dead or stalled worker's key, do. Returns attempts (this one included) and
-- how many earlier ones ended without a word.
local function count_attempt(attempts, id, token, also, failed)
  local n, w, last = read_attempts(attempts, id)
  if last == token or (last ~= '' and last == also) then
    redis.call('HSET', attempts, id, n .. ':' .. w .. ':' .. token)
    return n, math.max(n - 1 - w, 0)
  end
  if last ~= '' and last == failed then w = w + 1 end
  n = n + 1
  redis.call('HSET', attempts, id, n .. ':' .. w .. ':' .. token)
  return n, math.max(n - 1 - w, 0)
end

-- finish_entry's six arguments (ARGV[1..6]: group, entry ID, member or '', owner,
-- lease_ms, release), checked; publish_and_finish.lua takes the same first six.
local function finish_args(args, group, id, member, owner, lease, release)
  local f = {
    group = args:str('group', group, '^[%w%-_.:]+$'),
    id = args:str('entry_id', id, '^%d+%-%d+$'),
    member = '',
    owner = args:str('owner', owner, '^[%w%-_.:]+$'),
    lease = args:int('lease_ms', lease, 1),
    release = args:int('release', release, 0, 1),
  }
  if member ~= '' then f.member = args:member('member', member) end
  return f
end

-- An inbound entry is done (finish_entry.lua, publish_and_finish.lua): acknowledge
-- and delete it with its attempts counter and rejection record; with a member, it
-- leaves that key's mailbox and the owner sees the next entry (as claim_key shows
-- it), or releases the key when asked to or when nothing is waiting. `keys` are
-- the scripts' KEYS[1..4]: inbound, ready, attempts, rejected; `f` is finish_args'.
-- Returns the scripts' reply (see their headers).
local function finish_inbound_entry(keys, f)
  local inbound, ready, attempts, rejected = keys[1], keys[2], keys[3], keys[4]
  redis.call('XACK', inbound, f.group, f.id)
  redis.call('XDEL', inbound, f.id)
  redis.call('HDEL', attempts, f.id)
  redis.call('HDEL', rejected, f.id)
  if f.member == '' then return { 'done' } end
  local mailbox, owner_key = mailbox_keys(shard_prefix(ready), f.member)
  redis.call('LREM', mailbox, 1, f.id)
  if redis.call('GET', owner_key) ~= f.owner then return { 'lost' } end
  local head = redis.call('LINDEX', mailbox, 0)
  if not head then
    redis.call('DEL', owner_key)
    redis.call('SREM', ready, f.member)
    return { 'empty' }
  end
  if f.release == 1 then
    redis.call('DEL', owner_key)
    return { 'released' }
  end
  redis.call('PEXPIRE', owner_key, f.lease)
  local ended, silent = peek_attempts(attempts, head, '', '')
  return { 'ok', head, ended, silent, redis.call('HGET', rejected, head) or '' }
end

-- The shard context every session-ending script builds: {lru = {public, im},
-- sessions, stats, events, max_events, wall, prefix}. `keys` are its KEYS by name
-- (args:shard_keys), so no script reads them in an order of its own.
local function shard_context(keys, max_events, wall)
  return {
    lru = { public = keys.lru_public, im = keys.lru_im }, sessions = keys.sessions,
    stats = keys.stats, events = keys.events, max_events = max_events, wall = wall,
    prefix = shard_prefix(keys.sessions),
  }
end

-- Publish an event: stable reason code plus counts, never content. Exact MAXLEN.
-- The stream keeps the latest events; stats keeps an all-time count per reason.
local function emit(shard, reason, sid, member, ...)
  local uuid, channel = split_member(member)
  redis.call('XADD', shard.events, 'MAXLEN', shard.max_events, '*',
    'reason', reason, 'at', shard.wall, 'sid', sid, 'uuid', uuid, 'ch', channel, ...)
  redis.call('HINCRBY', shard.stats, 'events:' .. reason, 1)
end

-- Remove one session whole: its keys (part_keys, in SESSION_PARTS order), its
-- index entries and its bytes from the shard total, and publish `reason`.
-- Returns 1 if it existed, else 0.
local function end_session(shard, part_keys, member, reason)
  local _, channel = split_member(member)
  local meta = redis.call('HMGET', part_keys[1], 'sid', 'turns', 'bytes', 'abytes')
  redis.call('DEL', unpack(part_keys))
  redis.call('ZREM', shard.lru[channel], member)
  redis.call('ZREM', shard.sessions, member)
  if not meta[1] then
    return 0
  end
  local bytes = tonumber(meta[3]) or 0
  redis.call('HINCRBY', shard.stats, 'bytes', -(bytes + (tonumber(meta[4]) or 0)))
  emit(shard, reason, meta[1], member, 'turns', tonumber(meta[2]) or 0, 'bytes', bytes)
  return 1
end

-- Is the session `member` (last activity = its LRU score) expired at store time `now`?
-- A session without an LRU entry is treated as expired: it cannot be kept alive.
-- Also returns its last activity. expired_at: the same, its last activity (or nil)
-- read already.
local function expired_at(last, channel, now)
  return last == nil or now - last >= TTL_MS[channel]
end

local function is_expired(lru_key, member, channel, now)
  local last = tonumber(redis.call('ZSCORE', lru_key, member))
  return expired_at(last, channel, now), last
end

-- Expire up to `batch` sessions of the shard idle for at least their channel's
-- TTL at store time `now` (event expired_inactivity each), oldest activity first,
-- public then IM. The LRU index's score is last activity, so the victims are one
-- range read per channel: O(log n + batch), nothing when none is due. Used by
-- sweep_idle, and by record_turn for a few sessions a write (never the session
-- it writes: record_turn ends that one itself if it expired, and a live one is
-- not due).
-- Returns the number of sessions expired.
local CHANNELS = { 'public', 'im' }
local function expire_idle(shard, now, batch)
  local expired = 0
  for _, channel in ipairs(CHANNELS) do
    if expired < batch then
      local cutoff = now - TTL_MS[channel]
      local victims = redis.call('ZRANGEBYSCORE', shard.lru[channel], '-inf', cutoff, 'LIMIT', 0, batch - expired)
      for _, m in ipairs(victims) do
        end_session(shard, session_keys(shard.prefix, m), m, REASON.expired_inactivity)
        expired = expired + 1
      end
    end
  end
  return expired
end

-- ---------------------------------------------------------------- compaction

-- At most `n` bytes of s, never cutting a UTF-8 character; true if it cut.
local function utf8_prefix(s, n)
  if #s <= n then return s, false end
  local cut = n
  while cut > 0 do
    local b = string.byte(s, cut + 1)
    if b < 128 or b >= 192 then break end -- the next byte starts a character
    cut = cut - 1
  end
  return string.sub(s, 1, cut), true
end

-- One bounded summary line for a stored record, with role and provenance.
-- Residents' and tools' words stay marked untrusted. Newlines are flattened
-- so no stored text can start a line of its own. Returns line, is_tool.
local function summary_line(entry, line_bytes)
  local payload = string.match(entry, '^%d+|%d+|%x+|(.*)$')
  local ok, f = pcall(cjson.decode, payload or '')
  local head, text, is_tool = nil, '', false
  local parts = ok and type(f) == 'table' and KIND_HEAD[f[1]]
  if parts then -- head: parts[1] .. f[2] .. parts[2] .. ...; the next field is the text
    head = parts[1]
    for i = 2, #parts do head = head .. tostring(f[i]) .. parts[i] end
    text, is_tool = f[#parts + 1], f[1] == KIND_CODE.tool_summary
  end
  if head == nil or type(text) ~= 'string' then
    return '- (unreadable record, untrusted)', false
  end
  text = string.gsub(text, '[\r\n]+', ' ')
  local room = line_bytes - #head
  local kept, cut = utf8_prefix(text, room)
  if cut then kept = utf8_prefix(text, math.max(0, room - 6)) .. ' [...]' end
  return utf8_prefix(head .. kept, line_bytes), is_tool
end

-- Drop the oldest of `lines` (joined by '\n', `size` bytes) until they fit
-- `max_bytes`. Returns lines dropped and the new size.
local function trim_lines(lines, size, max_bytes)
  local dropped = 0
  while size > max_bytes and #lines > 0 do
    local first = table.remove(lines, 1)
    size = size - #first
    if #lines > 0 then size = size - 1 end -- its separator went with it
    dropped = dropped + 1
  end
  return dropped, size
end

-- ---------------------------------------------------------------- archive

-- The archive (opt-in) keeps folded records, out of the live context, for the
-- operator's transcript reader: a sorted set like the transcript (KEYS part
-- 'archive'), grouped into segments, one per compaction. The meta hash holds
-- the segments as 'first-last-bytes' items (oldest first) and their total in
-- 'abytes'. At the bound, whole oldest segments go.

local function parse_segments(text)
  local segments = {}
  for first, last, bytes in string.gmatch(text or '', '(%d+)%-(%d+)%-(%d+)') do
    segments[#segments + 1] = { tonumber(first), tonumber(last), tonumber(bytes) }
  end
  return segments
end

local function format_segments(segments)
  local parts = {}
  for i, seg in ipairs(segments) do parts[i] = seg[1] .. '-' .. seg[2] .. '-' .. seg[3] end
  return table.concat(parts, ',')
end

-- Move one folded entry into the archive's newest (open) segment of this compaction.
local function archive_entry(s, entry, seq)
  redis.call('ZADD', s.keys[5], seq, entry)
  local open = s.open_segment
  if open == nil then
    open = { seq, seq, 0 }
    s.open_segment = open
  end
  open[2], open[3] = seq, open[3] + #entry
end

-- Close this compaction's segment and drop whole oldest segments past the bounds.
-- Returns the change in archive bytes and the number of segments dropped.
local function close_segment(s, limits)
  local open = s.open_segment
  if open == nil then return 0, 0 end
  s.open_segment = nil
  local meta = redis.call('HMGET', s.keys[1], 'segments', 'abytes')
  local segments = parse_segments(meta[1])
  local abytes = (tonumber(meta[2]) or 0) + open[3]
  local delta, dropped = open[3], 0
  segments[#segments + 1] = open
  while #segments > 0 and (#segments > limits.max_archive_segments or abytes > limits.max_archive_bytes) do
    local oldest = table.remove(segments, 1)
    redis.call('ZREMRANGEBYSCORE', s.keys[5], oldest[1], oldest[2])
    abytes, delta, dropped = abytes - oldest[3], delta - oldest[3], dropped + 1
  end
  redis.call('HSET', s.keys[1], 'segments', format_segments(segments), 'abytes', abytes)
  return delta, dropped
end

-- ---------------------------------------------------------------- compaction (folding)

-- Fold a session's oldest records into its summary until it is back under its
-- low-water marks, never the newest record. `s` is the session's state
-- (see keep_session_bounds) with s.summary loaded; it is updated in place.
-- Folding is deterministic: the same records give the same summary bytes.
-- Returns records folded, summary lines dropped, seq of the last folded record.
local function compact(s, limits)
  local lines = {}
  for line in string.gmatch(s.summary, '[^\n]+') do lines[#lines + 1] = line end
  local size = #s.summary
  local folded, trimmed, last_seq = 0, 0, 0
  while s.turns > 1 and (s.turns > limits.low_turns or s.tools > limits.low_tools
      or s.turn_bytes + size > limits.low_session_bytes) do
    local oldest = redis.call('ZPOPMIN', s.keys[2])
    if limits.archive == 1 then archive_entry(s, oldest[1], tonumber(oldest[2])) end
    local line, is_tool = summary_line(oldest[1], limits.summary_line_bytes)
    if #lines > 0 then size = size + 1 end
    lines[#lines + 1] = line
    size = size + #line
    s.turns, s.turn_bytes = s.turns - 1, s.turn_bytes - #oldest[1]
    if is_tool then s.tools = s.tools - 1 end
    folded, last_seq = folded + 1, tonumber(oldest[2])
    local dropped
    dropped, size = trim_lines(lines, size, limits.max_summary_bytes)
    trimmed = trimmed + dropped
  end
  s.summary = table.concat(lines, '\n')
  return folded, trimmed, last_seq
end

-- Forget idempotency receipts of records up to `last_seq` (they left the transcript).
local function forget_receipts(idem_key, last_seq)
  local all = redis.call('HGETALL', idem_key)
  for i = 1, #all, 2 do
    local seq = tonumber(string.match(all[i + 1], '^(%d+):'))
    if seq == nil or seq <= last_seq then redis.call('HDEL', idem_key, all[i]) end
  end
end

-- Bring one session back within its own bounds (turns, tool results, bytes) by
-- folding its oldest records into the summary (and, when archiving, into a new
-- archive segment); publishes compacted (and summary_trimmed when old lines
-- drop). `s` = {keys = its part keys in SESSION_PARTS order, turns, tools,
-- bytes (its records' and its summary's, as the meta hash counts them)}; the
-- counts are updated in place, and s.archive_delta says how the archive's bytes
-- changed. The caller writes the counts to the meta hash and the byte changes to
-- the shard total. The summary is read only when the session must fold: a write
-- within its bounds needs only the total.
local function keep_session_bounds(shard, s, sid, member, limits)
  if s.turns <= limits.max_turns and s.tools <= limits.max_tools
      and s.bytes <= limits.max_session_bytes then
    return
  end
  s.summary = redis.call('GET', s.keys[4]) or ''
  s.turn_bytes = s.bytes - #s.summary
  local folded, trimmed, last_seq = compact(s, limits)
  if s.summary == '' then
    redis.call('DEL', s.keys[4])
  else
    redis.call('SET', s.keys[4], s.summary)
  end
  forget_receipts(s.keys[3], last_seq)
  s.bytes = s.turn_bytes + #s.summary
  local archived, dropped = close_segment(s, limits)
  s.archive_delta = (s.archive_delta or 0) + archived
  emit(shard, REASON.compacted, sid, member, 'folded', folded, 'turns', s.turns,
    'bytes', s.bytes, 'archived_segments_dropped', dropped)
  if trimmed > 0 then
    emit(shard, REASON.summary_trimmed, sid, member, 'lines', trimmed, 'summary_bytes', #s.summary)
  end
end

-- ---------------------------------------------------------------- eviction

-- The least-recently-active session of the shard other than `keep`; equal
-- activity breaks ties by UUID, then channel (the members' byte order).
-- Returns member and last activity, or nil.
local function lru_victim(shard, keep)
  local best, best_score = nil, nil
  for _, channel in ipairs(CHANNELS) do
    local head = redis.call('ZRANGE', shard.lru[channel], 0, 1, 'WITHSCORES')
    local m, score = head[1], head[2]
    if m == keep then m, score = head[3], head[4] end
    if m then
      score = tonumber(score)
      if best == nil or score < best_score or (score == best_score and byte_less(m, best)) then
        best, best_score = m, score
      end
    end
  end
  return best, best_score
end

-- While the shard holds too many sessions or too many bytes, end its
-- least-recently-active session (never `keep`), at most limits.max_evictions.
-- A victim already idle past its TTL is reported as expired, not evicted.
-- Returns the number of sessions ended.
local function evict_over_bounds(shard, limits, keep, now)
  local ended = 0
  while ended < limits.max_evictions do
    local sessions = redis.call('ZCARD', shard.lru.public) + redis.call('ZCARD', shard.lru.im)
    local bytes = tonumber(redis.call('HGET', shard.stats, 'bytes')) or 0
    local reason
    if sessions > limits.max_sessions then
      reason = REASON.evicted_session_limit
    elseif bytes > limits.max_aggregate_bytes then
      reason = REASON.evicted_aggregate_bytes
    else
      return ended
    end
    local victim, last = lru_victim(shard, keep)
    if victim == nil then return ended end
    local _, channel = split_member(victim)
    if now - last >= TTL_MS[channel] then reason = REASON.expired_inactivity end
    end_session(shard, session_keys(shard.prefix, victim), victim, reason)
    ended = ended + 1
  end
  return ended
end
