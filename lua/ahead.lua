-- ahead.lua: how many wait ahead of a join score in one lane of one
-- sub-line of a split route (src/queue/shards.rs), and how many in it.
-- Standalone (no prelude): it reads one key and writes nothing.
--
-- KEYS: [1] the lane's waiting key in the sub-line
-- ARGV: [1] the join score (µs)
-- Returns: {waiters with a lower score, waiters in the lane}

return {redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. ARGV[1]),
  redis.call('ZCARD', KEYS[1])}
