-- read_stats: one shard's totals: live sessions per channel and its stats hash.
-- Read-only. Counts only: no content, no UUIDs.
-- KEYS[1] = gm:{shard}:lru:public  (zset)  public sessions
-- KEYS[2] = gm:{shard}:lru:im      (zset)  IM sessions
-- KEYS[3] = gm:{shard}:stats       (hash)  bytes, redactions, events:<reason> counts
-- KEYS[4] = gm:{shard}:limits      (hash)  the limits the service runs with, if published
-- Returns: {public sessions, IM sessions, {stats field, value, ...}, {limit, value, ...}}
-- Flags:   no-writes (read-only; runs even while the server is out of memory)
-- Errors:  none

return {
  redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2]),
  redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[4]),
}
