-- dead_letter: record that an inbound entry was rejected, and why. Never its text.
-- KEYS[1] = gm:dead  (stream)  rejected entries: their ID and a stable reason code
-- ARGV[1] = rejected entry ID
-- ARGV[2] = reason: bad_uuid, bad_channel, missing_field, missing_text, bad_text,
--           oversized, unknown_field, gone, bad_encoding (a field is not valid UTF-8),
--           poison (handling failed [worker] max_attempts times)
-- ARGV[3] = max_entries (exact MAXLEN)
-- Returns: the dead-letter entry's ID
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local args = new_args()

local id = args:str('entry_id', ARGV[1], '^%d+%-%d+$')
local reason = args:str('reason', ARGV[2], '^[%l_]+$')
local known = {
  bad_uuid = true, bad_channel = true, missing_field = true, missing_text = true, bad_text = true,
  oversized = true, unknown_field = true, gone = true, bad_encoding = true, poison = true,
}
if not known[reason] then args:fail('reason') end
local max_entries = args:int('max_entries', ARGV[3], 1)
local err = args:error()
if err then return err end

return redis.call('XADD', KEYS[1], 'MAXLEN', max_entries, '*', 'id', id, 'reason', reason)
