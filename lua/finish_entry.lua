-- finish_entry: an inbound entry is done: acknowledge it, delete it, and hand over the next one.
-- Deleting the entry means residents' raw words do not stay in the inbound stream
-- once answered (the store keeps only redacted text). Its attempts counter and
-- rejection record go with it. With a member, the entry leaves that key's
-- mailbox; the owner keeps the lease and sees the next entry (as claim_key shows
-- it: no attempt is counted), or releases the key when asked to (shutting down)
-- or when nothing is waiting. publish_and_finish.lua is this step with the
-- entry's reply published in it.
-- KEYS[1] = gm:inbound              (stream)  inbound entries
-- KEYS[2] = {gm:inbound}:ready      (set)     keys with entries waiting
-- KEYS[3] = {gm:inbound}:attempts   (hash)    entry ID -> '<attempts>:<with a word>:<last token>'
-- KEYS[4] = {gm:inbound}:rejected   (hash)    entry ID -> dead-letter reason decided for it
-- ARGV[1] = group name
-- ARGV[2] = entry ID
-- ARGV[3] = member '<uuid>:<channel>', '' for an entry filed nowhere (dead-lettered)
-- ARGV[4] = owner: this worker's name
-- ARGV[5] = lease_ms (>= 1)
-- ARGV[6] = release (0|1): give the key up even if entries wait
-- Returns: {'ok', next_entry_id, ended_attempts, silent_attempts, rejected_reason or ''}
--          (still owned; as claim_key), {'empty'}, {'released'},
--          {'done'} (no member), {'lost'} (the lease had passed to another worker,
--          which answers the rest)
-- Flags:   none (writes: refused whole while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument
-- The key's mailbox and owner lease are named by mailbox_keys(), inside KEYS[2]'s hash tag.

local args = new_args()
local finish = finish_args(args, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local err = args:error()
if err then return err end

return finish_inbound_entry({ KEYS[1], KEYS[2], KEYS[3], KEYS[4] }, finish)
