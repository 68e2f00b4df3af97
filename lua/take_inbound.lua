-- take_inbound: read new inbound entries for this worker and file each under its conversation key.
-- Reading and filing happen in one atomic step, so every key's mailbox lists its
-- entries in stream (arrival) order, whichever worker read them. The worker that
-- owns a key (claim_key) answers its mailbox in order. Entries without a valid
-- avatar UUID and channel are returned with a reason and filed nowhere: the
-- reader dead-letters them. Fields are compared as bytes, never decoded, so a
-- UUID or channel holding bytes that are not UTF-8 is just not a valid one.
-- KEYS[1] = gm:inbound           (stream)  inbound entries
-- KEYS[2] = {gm:inbound}:ready   (set)     keys with entries waiting
-- ARGV[1] = group name
-- ARGV[2] = consumer name
-- ARGV[3] = count: most entries to take (1..1000)
-- Returns: {{entry_id, member '<uuid>:<channel>' or '', reason ('' or a dead-letter code)}, ...}
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument
--          "GM_NOGROUP <group>" when the stream or the group is gone (the server lost its data)
-- Mailboxes ({gm:inbound}:mbox:<member>, list) are named from the entries, inside the stream's hash tag.

local group = arg_str('group', ARGV[1], '^[%w%-_.:]+$')
local consumer = arg_str('consumer', ARGV[2], '^[%w%-_.:]+$')
local count = arg_int('count', ARGV[3], 1, 1000)
local err = arg_error()
if err then return err end

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
  if uuid == nil or channel == nil then
    reason = 'missing_field'
  elseif not string.match(string.lower(uuid), UUID_PATTERN) then
    reason = 'bad_uuid'
  elseif TTL_MS[channel] == nil then
    reason = 'bad_channel'
  else
    member = string.lower(uuid) .. ':' .. channel
    redis.call('RPUSH', (mailbox_keys(prefix, member)), id)
    redis.call('SADD', KEYS[2], member)
  end
  reply[#reply + 1] = { id, member, reason }
end
return reply
