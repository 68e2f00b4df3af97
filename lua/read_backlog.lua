-- read_backlog: how many inbound entries are not answered yet (the service's backlog).
-- Read-only. Each entry is deleted once answered or dead-lettered (finish_entry,
-- dead_letter), so the stream's length is what waits, taken by a worker or not.
-- KEYS[1] = gm:inbound  (stream)  inbound entries
-- Returns: the number of entries left in the stream (integer; 0 if it does not exist)
-- Flags:   no-writes (read-only; runs even while the server is out of memory)
-- Errors:  none

return redis.call('XLEN', KEYS[1])
