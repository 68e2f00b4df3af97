-- publish_and_finish: finish_entry with the entry's reply published in the same step.
-- One round trip instead of two (issue 16), and no crash can leave an entry finished
-- without its reply on the outbound stream. The outbound stream must be in the
-- inbound stream's cluster slot: every partitioned layout, and one partition on one
-- server; on a one-partition cluster `gm:outbound` is not, and the worker publishes
-- first (an XADD) and calls finish_entry. The reply is published even when the
-- lease has passed (as a worker that publishes first would have).
-- KEYS[1] = gm:inbound              (stream)  inbound entries
-- KEYS[2] = {gm:inbound}:ready      (set)     keys with entries waiting
-- KEYS[3] = {gm:inbound}:attempts   (hash)    entry ID -> '<attempts>:<with a word>:<last token>'
-- KEYS[4] = {gm:inbound}:rejected   (hash)    entry ID -> dead-letter reason decided for it
-- KEYS[5] = gm:outbound             (stream)  replies to the bridge (the same slot)
-- ARGV[1] = group name
-- ARGV[2] = entry ID
-- ARGV[3] = member '<uuid>:<channel>', '' for an entry filed nowhere
-- ARGV[4] = owner: this worker's name
-- ARGV[5] = lease_ms (>= 1)
-- ARGV[6] = release (0|1): give the key up even if entries wait
-- ARGV[7] = the outbound stream's approximate MAXLEN (>= 1)
-- ARGV[8..] = the reply's field, value pairs (avatar_uuid, channel, text, in_reply_to,
--           session_id: checked by the caller's builder, gridmem/stream_calls.py)
-- Returns: as finish_entry
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument ('reply': not 5 pairs)
-- The key's mailbox and owner lease are named by mailbox_keys(), inside KEYS[2]'s hash tag.

local args = new_args()
local finish = finish_args(args, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local most = args:int('max_replies', ARGV[7], 1)
if #ARGV ~= 17 then args:fail('reply') end
local err = args:error()
if err then return err end

redis.call('XADD', KEYS[5], 'MAXLEN', '~', most, '*', unpack(ARGV, 8, 17))
return finish_inbound_entry({ KEYS[1], KEYS[2], KEYS[3], KEYS[4] }, finish)
