-- take_inbound: read new inbound entries for this worker and file each under its conversation key.
-- Reading and filing happen in one atomic step, so every key's mailbox lists its
-- entries in stream (arrival) order, whichever worker read them. The worker that
-- owns a key (claim_key) answers its mailbox in order. An entry without a valid
-- avatar UUID and channel (the nil UUID is none: no avatar has it) is filed, with
-- its dead-letter reason in the rejected hash, under the reserved key of the nil
-- UUID: whichever worker claims that key dead-letters it, and if that worker
-- dies first the key is adopted like any other, so no such entry is stranded
-- between this read and its dead letter. Fields are compared as bytes, never
-- decoded, so a UUID or channel holding bytes that are not UTF-8 is just not a
-- valid one. Both are matched in any ASCII case and filed lowercase (`IM` under
-- `<uuid>:im`, as gridmem/validate.py parse_channel reads it); a channel with any
-- other byte (whitespace, a full-width or Cyrillic look-alike) is bad_channel.
-- KEYS[1] = gm:inbound              (stream)  inbound entries
-- KEYS[2] = {gm:inbound}:ready      (set)     keys with entries waiting
-- KEYS[3] = {gm:inbound}:rejected   (hash)    entry ID -> dead-letter reason decided for it
-- ARGV[1] = group name
-- ARGV[2] = consumer name
-- ARGV[3] = count: most entries to take (1..1000)
-- Returns: {{entry_id, member '<uuid>:<channel>', reason ('' or a dead-letter code)}, ...};
--          an entry with a reason is filed under '00000000-0000-0000-0000-000000000000:public'
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument
--          "GM_NOGROUP <group>" when the stream or the group is gone (the server lost its data)
-- Mailboxes ({gm:inbound}:mbox:<member>, list) are named from the entries, inside the stream's hash tag.

local args = new_args()

local group = args:str('group', ARGV[1], '^[%w%-_.:]+$')
local consumer = args:str('consumer', ARGV[2], '^[%w%-_.:]+$')
local count = args:int('count', ARGV[3], 1, 1000)
local err = args:error()
if err then return err end

local NIL_UUID = '00000000-0000-0000-0000-000000000000'

-- The channel named in any ASCII case, lowercase; nil if it names none. Letters are
-- lowered by hand: string.lower follows the C locale of the server process.
local function channel_of(raw)
  if not string.match(raw, '^[A-Za-z]+$') then return nil end
  local name = string.gsub(raw, '[A-Z]', function(c) return string.char(string.byte(c) + 32) end)
  if TTL_MS[name] == nil then return nil end
  return name
end
local prefix = shard_prefix(KEYS[2])
local reply = {}
local ok, read = pcall(redis.call, 'XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
  'STREAMS', KEYS[1], '>')
if not ok then return redis.error_reply('GM_NOGROUP ' .. group) end
if not read then return reply end
-- Redis and Valkey answer {{stream, entries}}; fakeredis answers {stream, entries}.
local entries = read[2]
if type(read[1]) == 'table' then entries = read[1][2] end
for _, entry in ipairs(entries or {}) do
  local id, fields = entry[1], entry[2]
  local uuid, channel = nil, nil
  for i = 1, #fields, 2 do
    if fields[i] == 'avatar_uuid' then uuid = fields[i + 1] end
    if fields[i] == 'channel' then channel = fields[i + 1] end
  end
  local member, reason = '', ''
  if channel ~= nil then channel = channel_of(channel) or '' end
  if uuid == nil or channel == nil then
    reason = DEAD.missing_field
  elseif not string.match(string.lower(uuid), UUID_PATTERN) or string.lower(uuid) == NIL_UUID then
    reason = DEAD.bad_uuid
  elseif channel == '' then
    reason = DEAD.bad_channel
  end
  if reason == '' then
    member = string.lower(uuid) .. ':' .. channel
  else
    member = NIL_UUID .. ':public'
    redis.call('HSET', KEYS[3], id, reason)
  end
  redis.call('RPUSH', (mailbox_keys(prefix, member)), id)
  redis.call('SADD', KEYS[2], member)
  reply[#reply + 1] = { id, member, reason }
end
return reply
