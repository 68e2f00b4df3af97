-- read_context: context()'s reads as one read-only function, for a server that is full.
-- Read-only. context() sends these reads as one MULTI/EXEC (gridmem/reads.py: cheaper
-- than a script). A full Redis server refuses every command queued in MULTI, reads
-- included (Valkey 8 runs them), but runs read-only functions: the store falls back
-- to this one when the transaction is refused for memory. Its reply is EXEC's, read
-- for read, so one parser reads both (docs/operations.md: reads work at maxmemory).
-- KEYS[1] = gm:{shard}:s:<uuid>:<ch>:meta     (hash)    session metadata
-- KEYS[2] = gm:{shard}:clock                  (hash)    clock domain
-- KEYS[3] = gm:{shard}:lru:<ch>               (zset)    last activity
-- KEYS[4] = gm:{shard}:s:<uuid>:<ch>:summary  (string)  factual summary
-- KEYS[5] = gm:{shard}:s:<uuid>:<ch>:turns    (zset)    transcript, score = seq
-- ARGV[1] = member '<uuid>:<channel>' of the session
-- ARGV[2..] = the clock hash fields to read (1-8; gridmem/reads.py clock_fields), so
--           this read and the MULTI/EXEC one ask for the same fields
-- Returns: {session id or nil, {clock field values, each or nil}, last activity or nil,
--           summary or nil, {entry, ...}}
-- Flags:   no-writes (read-only; runs even while the server is out of memory)
-- Errors:  "GM_BADARG <field>" on a malformed argument

local args = new_args()

local member = args:member('member', ARGV[1])
local fields = {}
for i = 2, #ARGV do fields[#fields + 1] = args:str('clock_field', ARGV[i], '^[%w_.:%-]+$') end
if #fields < 1 or #fields > 8 then args:fail('clock_field') end
local err = args:error()
if err then return err end

return {
  redis.call('HGET', KEYS[1], 'sid'),
  redis.call('HMGET', KEYS[2], unpack(fields)),
  redis.call('ZSCORE', KEYS[3], member),
  redis.call('GET', KEYS[4]),
  redis.call('ZRANGE', KEYS[5], 0, -1),
}
